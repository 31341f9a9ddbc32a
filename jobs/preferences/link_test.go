package preferences

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func linkSigner(t *testing.T, fill byte) *LinkSigner {
	t.Helper()
	s, err := NewLinkSigner(bytes.Repeat([]byte{fill}, LinkKeySize))
	require.NoError(t, err)
	return s
}

func TestLinkNamesItsUserUntilItExpires(t *testing.T) {
	t.Parallel()
	s := linkSigner(t, 1)
	now := time.Unix(1_800_000_000, 0)
	since := time.UnixMicro(1_700_000_000_123_456).UTC()
	for _, id := range []string{"a", "u_1842", "ann@example.com", strings.Repeat("z", maxLinkUserID)} {
		l := Link{UserID: id, UserSince: since}
		tok := s.Sign(l, now.Add(time.Hour))
		require.LessOrEqual(t, len(tok), MaxLinkTokenLen)
		got, expires, err := s.Verify(tok, now)
		require.NoError(t, err)
		require.Equal(t, l, got)
		require.Equal(t, now.Add(time.Hour).UTC(), expires)

		got, _, err = s.Verify(tok, now.Add(time.Hour))
		require.ErrorIs(t, err, ErrLinkExpired, "good until the second before its expiry")
		require.Equal(t, l, got)
	}
	require.Len(t, s.Sign(Link{UserID: strings.Repeat("z", maxLinkUserID), UserSince: since}, now), MaxLinkTokenLen)
}

func TestForgedLinksAreRefused(t *testing.T) {
	t.Parallel()
	s := linkSigner(t, 1)
	now := time.Unix(1_800_000_000, 0)
	l := Link{UserID: "ann", UserSince: time.UnixMicro(1_700_000_000_000_000).UTC()}
	tok := s.Sign(l, now.Add(time.Hour))

	_, _, err := linkSigner(t, 2).Verify(tok, now)
	require.ErrorIs(t, err, ErrLinkForged, "another key")

	raw, err := base64.RawURLEncoding.DecodeString(tok)
	require.NoError(t, err)
	for i := range raw {
		changed := bytes.Clone(raw)
		changed[i] ^= 0x01
		_, _, err := s.Verify(base64.RawURLEncoding.EncodeToString(changed), now)
		require.ErrorIs(t, err, ErrLinkForged, "byte %d changed", i)
	}
	// Another user's id in place of the token's, the MAC kept.
	other := append(bytes.Clone(raw[:linkHead]), "bob"...)
	other = append(other, raw[len(raw)-linkMACSize:]...)
	_, _, err = s.Verify(base64.RawURLEncoding.EncodeToString(other), now)
	require.ErrorIs(t, err, ErrLinkForged, "another user")
	noUser := append(bytes.Clone(raw[:linkHead]), raw[len(raw)-linkMACSize:]...)
	for _, bad := range []string{"", "!!!!", tok[:len(tok)-1], tok + "A", base64.RawURLEncoding.EncodeToString(noUser),
		strings.Repeat("A", MaxLinkTokenLen+1)} {
		_, _, err := s.Verify(bad, now)
		require.ErrorIs(t, err, ErrLinkForged, "%q", bad)
	}
	// A genuine token past its expiry whose expiry was moved on is forged,
	// not expired: the MAC is checked first.
	old := s.Sign(l, now.Add(-time.Hour))
	raw, err = base64.RawURLEncoding.DecodeString(old)
	require.NoError(t, err)
	raw[4]++
	_, _, err = s.Verify(base64.RawURLEncoding.EncodeToString(raw), now.Add(-2*time.Hour))
	require.ErrorIs(t, err, ErrLinkForged)
}

func TestLinkKeySize(t *testing.T) {
	t.Parallel()
	_, err := NewLinkSigner(make([]byte, 16))
	require.Error(t, err)
}
