package webpush

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/heraldpush/herald/jobs/push"
)

// maxWarmHosts bounds the push services one WarmFor opens connections to:
// the browsers' services are four, and an egress entry with a wildcard
// admits hosts without end. It is as many as an instant's warm-up opens
// connections at most (jobs), so that what it asks for is opened.
const maxWarmHosts = 32

// WarmFor opens, ahead of an instant, a connection to each push service
// the targets' endpoints name (those the egress policy admits, at most
// maxWarmHosts), with a HEAD of the service's root: it names no
// subscription and delivers nothing, and any answer proves the connection.
// The client keeps a connection 90 s idle (IdleConnTimeout), longer than an
// instant's look-ahead, so the instant's first push to each service goes
// out on it; without it, that push would pay the dial and the TLS handshake
// whenever the service had not been sent to for that long.
func (p *Provider) WarmFor(ctx context.Context, targets []push.Target) error {
	seen := map[string]bool{}
	var hosts []string
	for _, t := range targets {
		host := push.EndpointHost(t.Token)
		if host == "" || seen[host] || p.cfg.Egress.CheckEndpoint(t.Token) != nil {
			continue
		}
		seen[host] = true
		if hosts = append(hosts, host); len(hosts) == maxWarmHosts {
			break
		}
	}
	ctx, cancel := context.WithTimeout(ctx, max(p.cfg.RequestTimeout, push.WarmTimeout))
	defer cancel()
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for i, host := range hosts {
		wg.Go(func() { errs[i] = p.warmHost(ctx, host) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// warmHost opens a connection to the push service at host.
func (p *Provider) warmHost(ctx context.Context, host string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, "https://"+host+"/", nil)
	if err != nil {
		return fmt.Errorf("webpush: warm %s: %w", host, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("webpush: warm %s: %w", host, err)
	}
	resp.Body.Close()
	return nil
}
