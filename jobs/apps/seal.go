package apps

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// SealKeySize is the size of a sealing key: AES-256.
const SealKeySize = 32

// Sealer encrypts the private parts of apps' credentials for the database
// and opens them again: AES-256-GCM, a random nonce a value, and the
// credential's app, channel and version as additional data, so that a
// sealed value copied onto another credential's row does not open. It
// seals with its first key and opens with any of them, so that the
// sealing key can be replaced: give the new key first and the old one
// after it, rotate every app's credentials (or `herald apps reseal`), then
// drop the old key.
type Sealer struct {
	keys []sealKey
}

type sealKey struct {
	id   string
	aead cipher.AEAD
}

// ErrNoSealKey is what sealing without a key says: credentials cannot be
// stored until HERALD_SECRET_KEY is set.
var ErrNoSealKey = errors.New("no secret key to seal credentials with: set HERALD_SECRET_KEY (or HERALD_SECRET_KEY_FILE) to 32 random bytes in base64, e.g. from `openssl rand -base64 32`")

// ParseSealKeys reads HERALD_SECRET_KEY: one or more keys of 32 bytes in
// standard or URL base64, comma-separated, the first sealing. Empty gives
// a Sealer without keys, which opens and seals nothing (ErrNoSealKey).
func ParseSealKeys(s string) (*Sealer, error) {
	sl := &Sealer{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		raw, err := decodeKey(part)
		if err != nil || len(raw) != SealKeySize {
			return nil, fmt.Errorf("HERALD_SECRET_KEY: key %d is not %d bytes of base64 (make one with `openssl rand -base64 32`)", i+1, SealKeySize)
		}
		k, err := newSealKey(raw)
		if err != nil {
			return nil, err
		}
		sl.keys = append(sl.keys, k)
	}
	return sl, nil
}

// NewSealer is a Sealer of raw keys, the first sealing; for tests and Go
// callers.
func NewSealer(raw ...[]byte) (*Sealer, error) {
	sl := &Sealer{}
	for _, r := range raw {
		if len(r) != SealKeySize {
			return nil, fmt.Errorf("a sealing key is %d bytes, not %d", SealKeySize, len(r))
		}
		k, err := newSealKey(r)
		if err != nil {
			return nil, err
		}
		sl.keys = append(sl.keys, k)
	}
	return sl, nil
}

func decodeKey(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not base64")
}

func newSealKey(raw []byte) (sealKey, error) {
	block, err := aes.NewCipher(raw)
	if err != nil {
		return sealKey{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return sealKey{}, err
	}
	// The key's id is a digest of it, never the key: it says which key
	// sealed a value, so that a value the process has no key for says so.
	sum := sha256.Sum256(append([]byte("herald seal key "), raw...))
	return sealKey{id: hex.EncodeToString(sum[:8]), aead: aead}, nil
}

// CanSeal reports whether the Sealer has a key.
func (s *Sealer) CanSeal() bool { return s != nil && len(s.keys) > 0 }

// KeyID is the id of the key that seals: stored beside each sealed value.
func (s *Sealer) KeyID() string {
	if !s.CanSeal() {
		return ""
	}
	return s.keys[0].id
}

// additional is a credential's additional data: what binds a sealed value
// to its row.
func additional(appID int32, channel string, version int32) []byte {
	return fmt.Appendf(nil, "herald app credential/%d/%s/%d", appID, channel, version)
}

// Seal encrypts plaintext for the credential of app appID, channel and
// version: the nonce, then the ciphertext and its tag.
func (s *Sealer) Seal(appID int32, channel string, version int32, plaintext []byte) ([]byte, string, error) {
	if !s.CanSeal() {
		return nil, "", ErrNoSealKey
	}
	k := s.keys[0]
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plaintext)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, "", err
	}
	return k.aead.Seal(nonce, nonce, plaintext, additional(appID, channel, version)), k.id, nil
}

// Open decrypts what Seal sealed with the key keyID for the same app,
// channel and version.
func (s *Sealer) Open(appID int32, channel string, version int32, keyID string, sealed []byte) ([]byte, error) {
	if s != nil {
		for _, k := range s.keys {
			if k.id != keyID {
				continue
			}
			n := k.aead.NonceSize()
			if len(sealed) < n {
				return nil, errors.New("sealed credential is too short")
			}
			out, err := k.aead.Open(nil, sealed[:n], sealed[n:], additional(appID, channel, version))
			if err != nil {
				return nil, fmt.Errorf("sealed credential does not open with key %s: altered, or moved from another row", keyID)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("the credential was sealed with key %s, which HERALD_SECRET_KEY does not hold", keyID)
}
