package main

import (
	"bytes"
	"crypto/ecdh"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/apps"
)

// TestVAPIDGenerate: `herald vapid generate` prints a new pair each time,
// as the environment lines Herald reads, whose private half is the public
// one's and which a stored credential's check takes; a subject that is no
// contact is refused.
func TestVAPIDGenerate(t *testing.T) {
	t.Parallel()
	gen := func(args ...string) (map[string]string, error) {
		var out, errOut bytes.Buffer
		err := run(t.Context(), append([]string{"herald", "vapid", "generate"}, args...), env(nil), &out, &errOut)
		vars := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				vars[k] = v
			}
		}
		return vars, err
	}
	a, err := gen("--subject", "mailto:ops@example.com")
	require.NoError(t, err)
	b, err := gen()
	require.NoError(t, err)
	require.NotEqual(t, a["VAPID_PUBLIC_KEY"], b["VAPID_PUBLIC_KEY"])
	require.Equal(t, "mailto:ops@example.com", a["VAPID_SUBJECT"])
	priv, err := base64.RawURLEncoding.DecodeString(a["VAPID_PRIVATE_KEY"])
	require.NoError(t, err)
	key, err := ecdh.P256().NewPrivateKey(priv)
	require.NoError(t, err)
	require.Equal(t, a["VAPID_PUBLIC_KEY"], base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()))
	in := apps.WebPush{PublicKey: a["VAPID_PUBLIC_KEY"], PrivateKey: a["VAPID_PRIVATE_KEY"], Subject: a["VAPID_SUBJECT"]}
	require.NoError(t, in.Check())
	_, err = gen("--subject", "not a contact")
	require.Error(t, err)
}
