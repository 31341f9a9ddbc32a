package receipt

import (
	"bytes"
	"encoding/base64"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func signer(t *testing.T, fill byte) *Signer {
	t.Helper()
	s, err := NewSigner(bytes.Repeat([]byte{fill}, KeySize))
	require.NoError(t, err)
	return s
}

func TestTokenNamesItsDeliveryUntilItExpires(t *testing.T) {
	s := signer(t, 1)
	now := time.Unix(1_800_000_000, 0)
	for _, d := range []Delivery{{1, 1}, {123456, 98765432}, {math.MaxInt64, math.MaxInt64}} {
		tok := s.Sign(d, now.Add(time.Hour))
		require.LessOrEqual(t, len(tok), MaxLen)
		got, err := s.Verify(tok, now)
		require.NoError(t, err)
		require.Equal(t, d, got)

		got, err = s.Verify(tok, now.Add(time.Hour))
		require.ErrorIs(t, err, ErrExpired)
		require.Equal(t, d, got)
	}
	require.Len(t, s.Sign(Delivery{1_000_000, 10_000_000}, now), 32)
}

func TestForgedTokensAreRefused(t *testing.T) {
	s := signer(t, 1)
	now := time.Unix(1_800_000_000, 0)
	tok := s.Sign(Delivery{42, 7}, now.Add(time.Hour))

	_, err := signer(t, 2).Verify(tok, now)
	require.ErrorIs(t, err, ErrForged, "another key")

	raw, err := base64.RawURLEncoding.DecodeString(tok)
	require.NoError(t, err)
	for i := range raw {
		changed := bytes.Clone(raw)
		changed[i] ^= 0x01
		_, err := s.Verify(base64.RawURLEncoding.EncodeToString(changed), now)
		require.ErrorIs(t, err, ErrForged, "byte %d changed", i)
	}
	for _, bad := range []string{"", "!!!!", tok[:len(tok)-1], tok + "A", string(bytes.Repeat([]byte("A"), MaxLen+1))} {
		_, err := s.Verify(bad, now)
		require.ErrorIs(t, err, ErrForged, "%q", bad)
	}
	// A genuine token past its expiry whose expiry was moved on is forged,
	// not expired: the MAC is checked first.
	old := s.Sign(Delivery{42, 7}, now.Add(-time.Hour))
	raw, err = base64.RawURLEncoding.DecodeString(old)
	require.NoError(t, err)
	raw[len(raw)-macSize-1]++
	_, err = s.Verify(base64.RawURLEncoding.EncodeToString(raw), now.Add(-2*time.Hour))
	require.ErrorIs(t, err, ErrForged)
}

func TestKeySize(t *testing.T) {
	_, err := NewSigner(make([]byte, 16))
	require.Error(t, err)
}

func BenchmarkAppendSign(b *testing.B) {
	s, _ := NewSigner(make([]byte, KeySize))
	buf := make([]byte, 0, 64)
	at := time.Now().Add(time.Hour)
	b.ReportAllocs()
	for i := range b.N {
		buf = s.AppendSign(buf[:0], Delivery{MessageID: 12345, DeviceID: int64(i)}, at)
	}
}
