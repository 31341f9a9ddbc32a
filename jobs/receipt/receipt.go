// Package receipt makes and checks the receipt tokens Herald puts in every
// push: a short string naming one delivery (its message and device) and
// when it stops being good, with an HMAC under a key every process shares.
// An app sends the token back from the device with what happened to the
// push (POST /v1/receipts); the token is the credential, so a forged or
// expired one is refused without reading the database.
//
// A token is the base64url (unpadded) encoding of
//
//	version (1 byte) | message id (uvarint) | device id (uvarint) |
//	expiry (4 bytes, Unix seconds, big-endian) | MAC (12 bytes)
//
// where the MAC is the first 12 bytes of HMAC-SHA256 over everything before
// it. Herald's ids make that 23 to 30 bytes: 31 to 40 characters.
package receipt

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sync"
	"time"

	"github.com/heraldpush/herald/db"
)

// version is the token format's; a token of another is forged.
const version = 1

// macSize is how much of the HMAC a token carries: 96 bits, so a forger's
// chance per guess is 2^-96, and every guess is a request.
const macSize = 12

// KeySize is the size of a key: HMAC-SHA256's block is larger, but 32 random
// bytes are all the strength it has.
const KeySize = 32

// MaxLen bounds the length of a token: anything longer is not one. Callers
// reserve it in a payload's size budget.
const MaxLen = (1 + 2*binary.MaxVarintLen64 + 4 + macSize + 2) / 3 * 4

// Errors Verify returns: a token that is not Herald's or was changed, and
// one that was Herald's but is past its expiry.
var (
	ErrForged  = errors.New("receipt token is not valid")
	ErrExpired = errors.New("receipt token has expired")
)

// Delivery names the delivery a token stands for.
type Delivery struct {
	MessageID int64
	DeviceID  int64
}

// Signer makes and checks tokens under one key. It is safe for concurrent
// use.
type Signer struct {
	// macs holds HMAC states under the key, to be Reset and used again:
	// making one costs more than using it.
	macs sync.Pool
}

// NewSigner returns a Signer with key, which must be KeySize bytes.
func NewSigner(key []byte) (*Signer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("receipt: key must be %d bytes, got %d", KeySize, len(key))
	}
	key = bytes.Clone(key)
	s := &Signer{}
	s.macs.New = func() any { return hmac.New(sha256.New, key) }
	return s, nil
}

// Sign returns the token of d, good until expires (to the second).
func (s *Signer) Sign(d Delivery, expires time.Time) string {
	return string(s.AppendSign(nil, d, expires))
}

// AppendSign appends d's token to dst, as Sign makes it; a provider building
// one payload per device uses it to write the token in place.
func (s *Signer) AppendSign(dst []byte, d Delivery, expires time.Time) []byte {
	var buf [1 + 2*binary.MaxVarintLen64 + 4 + sha256.Size]byte
	b := append(buf[:0], version)
	b = binary.AppendUvarint(b, uint64(d.MessageID))
	b = binary.AppendUvarint(b, uint64(d.DeviceID))
	b = binary.BigEndian.AppendUint32(b, uint32(max(expires.Unix(), 0)))
	b = s.mac(b)
	return base64.RawURLEncoding.AppendEncode(dst, b)
}

// mac appends the truncated MAC of b to b.
func (s *Signer) mac(b []byte) []byte {
	h := s.macs.Get().(hash.Hash)
	h.Reset()
	h.Write(b)
	sum := h.Sum(b)
	s.macs.Put(h)
	return sum[:len(b)+macSize]
}

// Verify returns the delivery token names, ErrForged if the token is not
// one Sign made under this key, and ErrExpired if it is past its expiry at
// now. A forged token is refused before its expiry is read, so an expired
// answer always means a genuine token.
func (s *Signer) Verify(token string, now time.Time) (Delivery, error) {
	if len(token) > MaxLen {
		return Delivery{}, ErrForged
	}
	var buf [MaxLen]byte
	b, err := base64.RawURLEncoding.AppendDecode(buf[:0], []byte(token))
	if err != nil || len(b) < 1+1+1+4+macSize || b[0] != version {
		return Delivery{}, ErrForged
	}
	body, tag := b[:len(b)-macSize], b[len(b)-macSize:]
	var sum [1 + 2*binary.MaxVarintLen64 + 4 + sha256.Size]byte
	if !hmac.Equal(s.mac(append(sum[:0], body...))[len(body):], tag) {
		return Delivery{}, ErrForged
	}
	rest := body[1:]
	msg, n := binary.Uvarint(rest)
	if n <= 0 {
		return Delivery{}, ErrForged
	}
	rest = rest[n:]
	dev, n := binary.Uvarint(rest)
	if n <= 0 || len(rest[n:]) != 4 || msg > 1<<63-1 || dev > 1<<63-1 {
		return Delivery{}, ErrForged
	}
	d := Delivery{MessageID: int64(msg), DeviceID: int64(dev)}
	if expires := int64(binary.BigEndian.Uint32(rest[n:])); now.Unix() >= expires {
		return d, ErrExpired
	}
	return d, nil
}

// keyPurpose names the tokens' key among the keys every process shares
// (db.SharedKey): the workers sign with it, the API checks with it.
const keyPurpose = "receipt"

// Shared returns the Signer under the key every process of the deployment
// shares, drawing the key if no process has.
func Shared(ctx context.Context, q db.DBTX) (*Signer, error) {
	key, err := db.SharedKey(ctx, q, keyPurpose, KeySize)
	if err != nil {
		return nil, fmt.Errorf("receipt key: %w", err)
	}
	return NewSigner(key)
}
