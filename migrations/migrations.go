// Package migrations holds Herald's schema as numbered SQL files, embedded in
// the binary so that `herald migrate` needs nothing beside it. Files are named
// NNNN_description.sql and applied in order, each once.
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
