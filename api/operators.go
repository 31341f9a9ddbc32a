package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/argon2"

	"github.com/heraldpush/herald/db"
)

// MinPasswordLength is the shortest operator password accepted, named
// operators' and HERALD_ADMIN_PASSWORD alike. The sign-in throttle slows
// guessing down, but a short or dictionary password still falls to a
// patient guesser.
const MinPasswordLength = 12

// maxPasswordLength bounds what is hashed: a password is a line.
const maxPasswordLength = 1024

// Operators' passwords are hashed with argon2id at OWASP's first
// recommendation: 19 MiB, two passes, one lane. A check costs a few hundred
// milliseconds of one core, so at most maxPasswordChecks run at once in a
// process (sessions.passwordChecks).
const (
	argonTime    = 2
	argonMemory  = 19 * 1024 // KiB
	argonThreads = 1
	argonKeyLen  = 32
	argonSaltLen = 16
)

// operatorName is what an operator may be called: letters, digits and
// . _ @ -, starting with a letter or digit, at most 64 characters. The
// migration holds the table to the same.
var operatorName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// checkOperatorName refuses a name an operator cannot have, and admin,
// which is HERALD_ADMIN_PASSWORD's.
func checkOperatorName(name string) error {
	if !operatorName.MatchString(name) {
		return fmt.Errorf("operator name %q: use 1 to 64 letters, digits and . _ @ -, starting with a letter or digit", name)
	}
	if name == adminUser {
		return fmt.Errorf("operator name %q is HERALD_ADMIN_PASSWORD's operator; choose another", name)
	}
	return nil
}

// CheckPassword refuses a password too short (or too long) to be an
// operator's.
func CheckPassword(password string) error {
	if n := utf8.RuneCountInString(password); n < MinPasswordLength {
		return fmt.Errorf("the password is %d characters long; use at least %d random characters", n, MinPasswordLength)
	}
	if len(password) > maxPasswordLength {
		return fmt.Errorf("the password is longer than %d bytes", maxPasswordLength)
	}
	return nil
}

// hashPassword returns password's argon2id hash in PHC string form
// ($argon2id$v=19$m=...,t=...,p=...$salt$hash), which names its parameters,
// so that they can be raised later without breaking older hashes.
func hashPassword(password string) string {
	salt := make([]byte, argonSaltLen)
	_, _ = rand.Read(salt) // crypto/rand.Read never fails (Go 1.24+).
	sum := argon2.IDKey([]byte(password), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
		b64.EncodeToString(salt), b64.EncodeToString(sum))
}

// verifyPassword reports whether password is the one encoded hashes.
func verifyPassword(encoded, password string) (bool, error) {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false, errors.New("not an argon2id hash")
	}
	var (
		version, memory, passes int
		threads                 uint8
	)
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return false, fmt.Errorf("argon2id version %q", parts[2])
	}
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &memory, &passes, &threads); err != nil ||
		memory < 1 || memory > 1<<22 || passes < 1 || passes > 100 || threads < 1 {
		return false, fmt.Errorf("argon2id parameters %q", parts[3])
	}
	b64 := base64.RawStdEncoding
	salt, err := b64.DecodeString(parts[4])
	if err != nil {
		return false, fmt.Errorf("argon2id salt: %w", err)
	}
	want, err := b64.DecodeString(parts[5])
	if err != nil || len(want) == 0 {
		return false, errors.New("argon2id hash is not base64")
	}
	got := argon2.IDKey([]byte(password), salt, uint32(passes), uint32(memory), threads, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// decoyHash is hashed against when a sign-in names no operator, so that it
// takes as long as a wrong password does and does not tell which names
// exist.
var decoyHash = sync.OnceValue(func() string { return hashPassword("no operator has this password") })

// Operator is a named dashboard operator.
type Operator struct {
	Name      string
	CreatedAt time.Time
}

// CreateOperator stores a named operator with password's hash. A name taken
// already is an error that says so.
func CreateOperator(ctx context.Context, dbtx db.DBTX, name, password string) (Operator, error) {
	if err := checkOperatorName(name); err != nil {
		return Operator{}, err
	}
	if err := CheckPassword(password); err != nil {
		return Operator{}, err
	}
	row, err := db.On(dbtx).InsertOperator(ctx, db.InsertOperatorParams{Name: name, PasswordHash: hashPassword(password)})
	if errors.Is(err, db.ErrConflict) {
		return Operator{}, fmt.Errorf("an operator named %q exists already; remove it first to set a new password", name)
	}
	if err != nil {
		return Operator{}, fmt.Errorf("create operator: %w", err)
	}
	return Operator{Name: row.Name, CreatedAt: row.CreatedAt}, nil
}

// ListOperators returns the named operators by name.
func ListOperators(ctx context.Context, dbtx db.DBTX) ([]Operator, error) {
	rows, err := db.On(dbtx).ListOperators(ctx)
	if err != nil {
		return nil, fmt.Errorf("list operators: %w", err)
	}
	out := make([]Operator, 0, len(rows))
	for _, r := range rows {
		out = append(out, Operator{Name: r.Name, CreatedAt: r.CreatedAt})
	}
	return out, nil
}

// ErrNoSuchOperator is RemoveOperator's error for a name no operator has.
var ErrNoSuchOperator = errors.New("no such operator")

// RemoveOperator deletes a named operator and ends its sessions on every
// process, in one transaction.
func RemoveOperator(ctx context.Context, pool db.TxBeginner, name string) error {
	err := db.InTx(ctx, pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		n, err := q.DeleteOperator(ctx, name)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w named %q", ErrNoSuchOperator, name)
		}
		_, err = q.RevokeOperatorSessions(ctx, name)
		return err
	})
	if err != nil && !errors.Is(err, ErrNoSuchOperator) {
		return fmt.Errorf("remove operator: %w", err)
	}
	return err
}
