package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push/fake"
)

func TestRunFakepush(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runFakepush(ctx, []string{"--addr", "127.0.0.1:0", "--latency", "1ms", "--tls-dir", dir,
			"--receipts-url", "http://127.0.0.1:9", "--delivered", "0.5", "--opened", "0.25", "--receipt-delay", "10ms,20ms"},
			func(string) string { return "" }, &stdout, &stderr)
	}()

	envPath := filepath.Join(dir, "env")
	require.Eventually(t, func() bool {
		_, err := os.Stat(envPath)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "DIR/env appears; stderr: %s", &stderr)
	data, err := os.ReadFile(envPath)
	require.NoError(t, err)
	env := fake.ParseEnvFile(data)

	// A client configured from DIR/env alone reaches the server.
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(env["SSL_CERT_FILE"])
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	resp, err := client.Get(env["APNS_HOST"] + "/_stats")
	require.NoError(t, err)
	var stats fake.Stats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, stdout.String(), "fakepush listening on "+env["APNS_HOST"])

	var controls []fake.ChannelControl
	resp, err = client.Get(env["APNS_HOST"] + "/_control")
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&controls))
	resp.Body.Close()
	require.Equal(t, 1, controls[0].LatencyMS, "--latency reached the server")

	var devices fake.Devices
	resp, err = client.Get(env["APNS_HOST"] + "/_devices")
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&devices))
	resp.Body.Close()
	require.Equal(t, fake.Devices{ReceiptsURL: "http://127.0.0.1:9", Delivered: 0.5, Opened: 0.25,
		DelayMS: [2]int{10, 20}, OpenAfterMS: [2]int{1000, 5000}}, devices, "the devices' flags reached the server")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("runFakepush did not return after its context was cancelled")
	}
	require.Contains(t, stdout.String(), "fakepush stopped")
	_, err = client.Get(env["APNS_HOST"] + "/_stats")
	require.Error(t, err, "the listener is closed")
}

func TestRunFakepushRejectsBadFlags(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	getenv := func(string) string { return "" }
	err := runFakepush(context.Background(), []string{"--latency", "soon"}, getenv, &stdout, &stderr)
	require.Error(t, err)
	err = runFakepush(context.Background(), []string{"--tls-dir", t.TempDir(), "--receipts-url", "http://x", "--receipt-delay", "2s,1s"}, getenv, &stdout, &stderr)
	require.ErrorContains(t, err, "--receipt-delay")
	err = runFakepush(context.Background(), []string{"--tls-dir", t.TempDir(), "--receipts-url", "http://x", "--opened", "0.95"}, getenv, &stdout, &stderr)
	require.ErrorContains(t, err, "opened")
	err = runFakepush(context.Background(), []string{"--tls-dir", t.TempDir(), "--latency", "-1s"}, getenv, &stdout, &stderr)
	require.ErrorContains(t, err, "Latency")
	err = runFakepush(context.Background(), []string{"extra"}, getenv, &stdout, &stderr)
	require.ErrorContains(t, err, "unexpected arguments")
	require.NoError(t, runFakepush(context.Background(), []string{"-h"}, getenv, &stdout, &stderr))
	require.Contains(t, stderr.String(), "usage: herald fakepush")
}
