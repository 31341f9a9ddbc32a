package fake

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseJWS(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	good := signJWT(t, key, map[string]any{"kid": "K"}, map[string]any{"iss": "T", "iat": 1.7e9})

	j, err := parseJWS(good)
	require.NoError(t, err)
	require.Equal(t, jwsHeader{Alg: "ES256", Kid: "K"}, j.header)
	require.True(t, j.verifyES256(&key.PublicKey))
	require.False(t, j.verifyES256(&other.PublicKey))
	require.False(t, j.verifyRS256(nil), "the algorithm must match the header")
	claims, err := j.decodeClaims()
	require.NoError(t, err)
	require.Equal(t, jwtClaims{Iss: "T", Iat: 1.7e9}, claims)

	for _, bad := range []string{"", "a", "a.b", "a.b.c.d", "!!.e30.AA", "e30.!!.AA", "e30.e30.!!", "bm90IGpzb24.e30.AA"} {
		_, err := parseJWS(bad)
		require.ErrorIs(t, err, errMalformedJWT, bad)
	}
	// A valid signature over a tampered payload fails.
	parts := []byte(good)
	parts[len("eyJhbGciOiJFUzI1NiIsImtpZCI6IksifQ.")+2] ^= 1
	j, err = parseJWS(string(parts))
	if err == nil {
		require.False(t, j.verifyES256(&key.PublicKey))
	}
}

func TestFormatCheckers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		check func(string) bool
		in    string
		want  bool
	}{
		{isProtoDuration, "30s", true},
		{isProtoDuration, "3.5s", true},
		{isProtoDuration, "0.000000001s", true},
		{isProtoDuration, "30", false},
		{isProtoDuration, "s", false},
		{isProtoDuration, "1.s", false},
		{isProtoDuration, ".5s", false},
		{isProtoDuration, "1.0000000001s", false},
		{isProtoDuration, "-1s", false},
		{isProtoDuration, "1m", false},
		{isHex, "deadBEEF01", true},
		{isHex, "", false},
		{isHex, "xyz", false},
		{isCanonicalUUID, "0b4e2a9c-8e4a-4c3b-9f2d-7a1b2c3d4e5f", true},
		{isCanonicalUUID, "0b4e2a9c8e4a4c3b9f2d7a1b2c3d4e5f", false},
		{isCanonicalUUID, "0b4e2a9c-8e4a-4c3b-9f2d-7a1b2c3d4e5g", false},
		{isBase64URL, "abc-_09", true},
		{isBase64URL, "a b", false},
		{isBase64URL, "a+b/", false},
		{isFCMToken, "cJ3x:APA91b-_.x", true},
		{isFCMToken, "a b", false},
		{isFCMTopic, "news~%_.-", true},
		{isFCMTopic, "/topics/news", false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, tt.check(tt.in), "%q", tt.in)
	}
	require.True(t, isCanonicalUUID(newUUID()))
	first, second := newUUID(), newUUID()
	require.NotEqual(t, first, second)
}

func TestJSONString(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		`"m1"`:       "m1",
		`"a\"b"`:     `a"b`,
		`"\u00e9"`:   "é",
		`12`:         "",
		`null`:       "",
		``:           "",
		`"unclosed`:  "",
		`{"a":"b"}`:  "",
		`"with\\\\"`: `with\\`,
	} {
		require.Equal(t, want, jsonString([]byte(raw)), raw)
	}
}

func TestAPNsTopicSuffix(t *testing.T) {
	t.Parallel()
	for pushType, want := range map[string]string{
		"": "", "alert": "", "background": "", "voip": ".voip", "complication": ".complication",
		"fileprovider": ".pushkit.fileprovider", "liveactivity": ".push-type.liveactivity",
		"pushtotalk": ".voip-ptt", "widgets": ".push-type.widgets", "location": ".location-query",
	} {
		got, ok := apnsTopicSuffix(pushType)
		require.True(t, ok, pushType)
		require.Equal(t, want, got, pushType)
	}
	_, ok := apnsTopicSuffix("shout")
	require.False(t, ok)
}

func TestForEachField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		ok   bool
		want map[string]string
	}{
		{`{"aps":{"alert":{"title":"a}b"}},"herald_message_id":"m1"}`, true, map[string]string{"aps": `{"alert":{"title":"a}b"}}`, "herald_message_id": `"m1"`}},
		{` { "a" : [1,{"b":"]"}] , "c":true,"d":null,"e":-1.5e3 } `, true, map[string]string{"a": `[1,{"b":"]"}]`, "c": "true", "d": "null", "e": "-1.5e3"}},
		{`{"k\"ey":"v\"al","\u0061ps":{}}`, true, map[string]string{`k"ey`: `"v\"al"`, "aps": "{}"}},
		{`{}`, true, map[string]string{}},
		{`[]`, false, nil},
		{`"x"`, false, nil},
		{`{"a":}`, false, nil},
		{``, false, nil},
		{`{"a":1}x`, false, nil},
	}
	for _, tt := range tests {
		got := map[string]string{}
		ok := forEachField([]byte(tt.in), func(k, v []byte) { got[string(k)] = string(v) })
		require.Equal(t, tt.ok, ok, tt.in)
		if tt.ok {
			require.Equal(t, tt.want, got, tt.in)
		}
	}
}
