package main

import (
	"errors"
	"fmt"
	"strings"
)

// config is the environment's configuration of a Herald process (CONTRACT
// section 1). Flags may override some fields after it is read.
type config struct {
	DatabaseURL   string
	Addr          string
	APIKeys       []string
	AdminPassword string
}

// loadConfig reads the configuration from getenv, filling defaults in one
// place. It checks shapes, not reachability.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL:   getenv("DATABASE_URL"),
		Addr:          getenv("HERALD_ADDR"),
		AdminPassword: getenv("HERALD_ADMIN_PASSWORD"),
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8080"
	}
	for _, k := range strings.Split(getenv("HERALD_API_KEYS"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			c.APIKeys = append(c.APIKeys, k)
		}
	}
	return c, nil
}

func (c config) requireDatabase() error {
	if c.DatabaseURL == "" {
		return errors.New("DATABASE_URL is not set: point it at a PostgreSQL database (postgres://user:pass@host:5432/herald), or use `make run`, which starts a local one")
	}
	return nil
}

// validateAPIKeys refuses keys too short to be secret.
func (c config) validateAPIKeys() error {
	for i, k := range c.APIKeys {
		if len(k) < 16 {
			return fmt.Errorf("HERALD_API_KEYS: key %d is %d characters long; use at least 16 random characters", i+1, len(k))
		}
	}
	return nil
}
