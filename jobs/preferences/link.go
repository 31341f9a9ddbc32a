package preferences

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// LinkKeyPurpose names the links' key among the keys every process shares.
const LinkKeyPurpose = "preferences-link"

// LinkKeySize is the size of the links' key.
const LinkKeySize = 32

const (
	linkVersion = 1
	// linkMACSize is 128 bits, more than a receipt's 96: a link is good
	// for months and opens a person's settings, and a URL has the room.
	linkMACSize = 16
	// linkHead is what a token holds before the user id.
	linkHead = 1 + 4 + 8
	// maxLinkUserID is the longest user id (jobs.CheckID).
	maxLinkUserID = 128
)

// MaxLinkTokenLen bounds the length of a token: anything longer is not one.
const MaxLinkTokenLen = ((linkHead+maxLinkUserID+linkMACSize)*8 + 5) / 6

// Errors LinkSigner.Verify returns: a token that is not Herald's or was changed,
// and one that was Herald's but is past its expiry.
var (
	ErrLinkForged  = errors.New("preferences link token is not valid")
	ErrLinkExpired = errors.New("preferences link token has expired")
)

// Link is whose form a token opens: the user, and when the user was made.
type Link struct {
	UserID    string
	UserSince time.Time
}

// LinkSigner makes and checks the tokens of links to a user's own form
// (POST /v1/users/{id}/preferences/link). A token is the form's only
// credential: the app opens the link on the phone, which never holds an
// API key. It names the user, when the user was made and when the token
// stops being good, under an HMAC with a key every process shares
// (db.SharedKey, LinkKeyPurpose), so that a forged or changed token is
// refused without reading the database. It is the base64url (unpadded)
// encoding of
//
//	version (1 byte) | expiry (4 bytes, Unix seconds, big-endian) |
//	user made (8 bytes, Unix microseconds, big-endian) | user id | MAC (16 bytes)
//
// where the MAC is the first 16 bytes of HMAC-SHA256 over everything
// before it. The user's making time ties a token to the user it was made
// for: once the user is erased, the token opens nothing, even should the
// id be used again. A LinkSigner is safe for concurrent use.
type LinkSigner struct {
	key []byte
}

// NewLinkSigner returns a LinkSigner with key, which must be LinkKeySize
// bytes.
func NewLinkSigner(key []byte) (*LinkSigner, error) {
	if len(key) != LinkKeySize {
		return nil, fmt.Errorf("preferences link: key must be %d bytes, got %d", LinkKeySize, len(key))
	}
	return &LinkSigner{key: append([]byte(nil), key...)}, nil
}

// Sign returns the token of l, good until expires (to the second). l's
// user id is one jobs.CheckID allows.
func (s *LinkSigner) Sign(l Link, expires time.Time) string {
	b := make([]byte, 0, linkHead+len(l.UserID)+sha256.Size)
	b = append(b, linkVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(max(expires.Unix(), 0)))
	b = binary.BigEndian.AppendUint64(b, uint64(l.UserSince.UnixMicro()))
	b = append(b, l.UserID...)
	return base64.RawURLEncoding.EncodeToString(s.mac(b))
}

// mac appends the truncated MAC of b to b.
func (s *LinkSigner) mac(b []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write(b)
	return h.Sum(b)[:len(b)+linkMACSize]
}

// Verify returns the link token names, ErrLinkForged if the token is not
// one Sign made under this key, and ErrLinkExpired if it is past its
// expiry at now (with the link, and when it expired). A forged token is
// refused before its expiry is read, so an expired answer always means a
// genuine token.
func (s *LinkSigner) Verify(token string, now time.Time) (Link, time.Time, error) {
	if len(token) > MaxLinkTokenLen {
		return Link{}, time.Time{}, ErrLinkForged
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) < linkHead+1+linkMACSize || b[0] != linkVersion {
		return Link{}, time.Time{}, ErrLinkForged
	}
	body, tag := b[:len(b)-linkMACSize], b[len(b)-linkMACSize:]
	if !hmac.Equal(s.mac(append([]byte(nil), body...))[len(body):], tag) {
		return Link{}, time.Time{}, ErrLinkForged
	}
	expires := time.Unix(int64(binary.BigEndian.Uint32(body[1:5])), 0).UTC()
	l := Link{
		UserSince: time.UnixMicro(int64(binary.BigEndian.Uint64(body[5:linkHead]))).UTC(),
		UserID:    string(body[linkHead:]),
	}
	if !now.Before(expires) {
		return l, expires, ErrLinkExpired
	}
	return l, expires, nil
}
