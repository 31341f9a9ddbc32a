package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs"
)

func TestLoadConfigLimits(t *testing.T) {
	t.Parallel()
	// Unset, the limits are zero: api and jobs fill in their defaults.
	c, err := loadConfig(env(nil))
	require.NoError(t, err)
	require.Zero(t, c.RateLimit)
	require.Zero(t, c.RateBurst)
	require.Zero(t, c.MaxDevicesPerUser)
	require.Equal(t, jobs.ScheduleLimits{}, c.ScheduleLimits)

	c, err = loadConfig(env(map[string]string{
		"HERALD_RATE_LIMIT": "50", "HERALD_RATE_BURST": "80", "HERALD_MAX_DEVICES_PER_USER": "20",
		"HERALD_SCHEDULE_MIN_INTERVAL": "15m", "HERALD_SCHEDULE_MAX_AHEAD": "30",
	}))
	require.NoError(t, err)
	require.Equal(t, 50, c.RateLimit)
	require.Equal(t, 80, c.RateBurst)
	require.Equal(t, 20, c.MaxDevicesPerUser)
	require.Equal(t, jobs.ScheduleLimits{MinInterval: 15 * time.Minute, MaxAhead: 30}, c.ScheduleLimits)

	for name, value := range map[string]string{
		"HERALD_RATE_LIMIT": "0", "HERALD_RATE_BURST": "lots", "HERALD_MAX_DEVICES_PER_USER": "-1",
		"HERALD_SCHEDULE_MIN_INTERVAL": "30s", "HERALD_SCHEDULE_MAX_AHEAD": "0",
	} {
		_, err := loadConfig(env(map[string]string{name: value}))
		require.ErrorContains(t, err, name)
	}
}

func TestLoadConfigSchema(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(env(nil))
	require.NoError(t, err)
	require.Equal(t, "herald", c.DBSchema)
	c, err = loadConfig(env(map[string]string{"HERALD_DB_SCHEMA": "push_2"}))
	require.NoError(t, err)
	require.Equal(t, "push_2", c.DBSchema)
	_, err = loadConfig(env(map[string]string{"HERALD_DB_SCHEMA": "Push"}))
	require.ErrorContains(t, err, "HERALD_DB_SCHEMA")
}

func TestLoadConfigRetention(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(env(nil))
	require.NoError(t, err)
	require.Equal(t, 30*24*time.Hour, c.Retention)

	c, err = loadConfig(env(map[string]string{"HERALD_RETENTION": "3m"}))
	require.NoError(t, err)
	require.Equal(t, 3*time.Minute, c.Retention)

	// Shorter than a minute deletes what a test is still reading.
	_, err = loadConfig(env(map[string]string{"HERALD_RETENTION": "30s"}))
	require.ErrorContains(t, err, "HERALD_RETENTION")
}

func TestLoadConfigDeviceRetention(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(env(nil))
	require.NoError(t, err)
	require.Equal(t, 30*24*time.Hour, c.DeviceRetention)

	c, err = loadConfig(env(map[string]string{"HERALD_DEVICE_RETENTION": "168h"}))
	require.NoError(t, err)
	require.Equal(t, 7*24*time.Hour, c.DeviceRetention)

	for _, bad := range []string{"30s", "-1h", "a week"} {
		_, err = loadConfig(env(map[string]string{"HERALD_DEVICE_RETENTION": bad}))
		require.ErrorContains(t, err, "HERALD_DEVICE_RETENTION", bad)
	}
}

func TestLoadConfigReceipts(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(env(nil))
	require.NoError(t, err)
	require.True(t, c.Receipts, "receipts are on unless turned off")
	require.Equal(t, 7*24*time.Hour, c.ReceiptWindow)

	c, err = loadConfig(env(map[string]string{"HERALD_RECEIPTS": "off", "HERALD_RECEIPT_WINDOW": "48h"}))
	require.NoError(t, err)
	require.False(t, c.Receipts)
	require.Equal(t, 48*time.Hour, c.ReceiptWindow)

	_, err = loadConfig(env(map[string]string{"HERALD_RECEIPTS": "maybe"}))
	require.ErrorContains(t, err, "HERALD_RECEIPTS")
	for _, v := range []string{"1s", "9000h"} {
		_, err = loadConfig(env(map[string]string{"HERALD_RECEIPT_WINDOW": v}))
		require.ErrorContains(t, err, "HERALD_RECEIPT_WINDOW", v)
	}
}

// TestLoadConfigPublicURL: HERALD_PUBLIC_URL is a base URL, kept without
// its trailing slash; anything else stops the start.
func TestLoadConfigPublicURL(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(env(nil))
	require.NoError(t, err)
	require.Empty(t, c.PublicURL)
	for value, want := range map[string]string{
		"https://push.example.com":        "https://push.example.com",
		"https://push.example.com/":       "https://push.example.com",
		"http://10.0.0.5:8081":            "http://10.0.0.5:8081",
		"https://www.example.com/herald/": "https://www.example.com/herald",
	} {
		c, err := loadConfig(env(map[string]string{"HERALD_PUBLIC_URL": value}))
		require.NoError(t, err, value)
		require.Equal(t, want, c.PublicURL, value)
	}
	for _, bad := range []string{"push.example.com", "ftp://push.example.com", "https://", "https://user:pw@push.example.com",
		"https://push.example.com/?x=1", "https://push.example.com/#top", "https:push.example.com", "/preferences"} {
		_, err := loadConfig(env(map[string]string{"HERALD_PUBLIC_URL": bad}))
		require.ErrorContains(t, err, "HERALD_PUBLIC_URL", bad)
	}
}
