// Package db is Herald's PostgreSQL: the queries (queries/*.sql, compiled
// by sqlc into *.sql.go), the few statements that need more than one query
// (the audience's expansion, a chunk's beginning, the ledger's pipelined
// writes, registrations), the migrations' runner, and the pool.
//
// Every query takes a DBTX (a pool, a connection or a transaction) through
// On, which also translates driver errors once: no rows is ErrNotFound, a
// unique violation ErrConflict, an unreachable database ErrUnavailable.
// River's own tables are touched only in river.go, each use pinned by a
// test against the embedded River. dbtest makes each test a database of its
// own, cloned from a migrated template.
package db
