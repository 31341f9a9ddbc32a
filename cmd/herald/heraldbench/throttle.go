package heraldbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/heraldpush/herald/jobs/push/fake"
)

// Throttled is what a run says of its healthy devices, and with --throttled
// of the throttled ones: fakepush answers a share of the devices 429 once,
// as a provider answers a sender that pushes to one device too fast, and
// the run checks that the others are sent as fast as without it, that no
// throttled device was sent to again before its Retry-After, and that no
// breaker opened.
type Throttled struct {
	// Share is --throttled; RetryAfterS the Retry-After of the 429s.
	Share       float64 `json:"share"`
	RetryAfterS int     `json:"retry_after_s"`
	// Devices are the measured bulk messages' devices the throttle
	// covered, each answered 429 once (Answered429 in all); Early counts
	// the pushes to them that came before their Retry-After was over.
	Devices     int   `json:"devices"`
	Answered429 int64 `json:"answered_429"`
	Early       int64 `json:"early"`
	// HealthySkewMs is receipt_skew_ms of the other devices, and
	// HealthyFanoutMs the span of their receipts; HealthyFanoutBlast is
	// that span over blast_ms. Without --throttled every device is
	// healthy, so a run with it compares with one without.
	HealthySkewMs      summary `json:"healthy_skew_ms"`
	HealthyFanoutMs    float64 `json:"healthy_fanout_ms"`
	HealthyFanoutBlast float64 `json:"healthy_fanout_blast"`
	// BreakerFailures are the transient failures Herald's breakers
	// counted over the run, by channel: a breaker opens only on them, so
	// none means none opened.
	BreakerFailures map[string]int `json:"breaker_failures"`
}

// throttleRetryAfter is the Retry-After, in seconds, of the run's 429s.
const throttleRetryAfter = 1

// throttle makes fakepush throttle Config.Throttled of every channel's
// devices from now on.
func (b *Benchmark) throttle(ctx context.Context) error {
	if b.Config.Throttled <= 0 {
		return nil
	}
	for _, ch := range []string{"apns", "fcm", "webpush"} {
		body, _ := json.Marshal(fake.Control{Channel: ch, Throttle: &fake.Throttle{ // plain values: cannot fail
			Share: b.Config.Throttled, RetryAfterS: throttleRetryAfter,
		}})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.fakeURL+"/_control", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := b.fakeHTTP.Do(req)
		if err != nil {
			return fmt.Errorf("throttle %s: %w", ch, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("throttle %s: fakepush answered %s", ch, resp.Status)
		}
	}
	b.Progress("fakepush throttles %.1f%% of the devices, once each, with Retry-After: %d", 100*b.Config.Throttled, throttleRetryAfter)
	return nil
}

// throttledKey is the key fakepush throttles a receipt's device by: its
// token, or a subscription's id, which ends its endpoint.
func throttledKey(r fake.Receipt) string {
	if r.Channel == "webpush" {
		return r.Token[strings.LastIndexByte(r.Token, '/')+1:]
	}
	return r.Token
}

// throttledView fills in res.Throttled from fakepush's receipts of the bulk
// messages and its record of the throttled devices, and the breakers'
// failures from Herald's /v1/providers.
func (b *Benchmark) throttledView(ctx context.Context, s scheduled, res *Result) error {
	t := &Throttled{Share: b.Config.Throttled, BreakerFailures: map[string]int{}}
	if t.Share > 0 {
		t.RetryAfterS = throttleRetryAfter
	}
	var skews []float64
	var first, last time.Time
	for _, id := range s.bulkIDs {
		err := b.eachReceipt(ctx, id, func(r *fake.Receipt) {
			if fake.InThrottleShare(throttledKey(*r), t.Share) {
				t.Devices++
				return
			}
			skews = append(skews, float64(r.ReceivedAt.Sub(s.dispatchAt).Microseconds())/1000)
			if first.IsZero() || r.ReceivedAt.Before(first) {
				first = r.ReceivedAt
			}
			if r.ReceivedAt.After(last) {
				last = r.ReceivedAt
			}
		})
		if err != nil {
			return err
		}
	}
	slices.Sort(skews)
	t.HealthySkewMs = summarize(skews)
	t.HealthyFanoutMs = ms(last.Sub(first))
	var throttled []fake.ThrottledDevice
	if err := b.getFake(ctx, "/_throttled", &throttled); err != nil {
		return err
	}
	for _, d := range throttled {
		t.Answered429 += int64(d.Answered429)
		t.Early += int64(d.Early)
	}
	providers, err := b.api.GetProvidersWithResponse(ctx)
	if err := answered("read the providers' breakers", http.StatusOK, providers, err); err != nil {
		return err
	}
	for ch, p := range *providers.JSON200 {
		if p.Configured {
			t.BreakerFailures[ch] = p.Failures
		}
	}
	res.Throttled = t
	return nil
}

// getFake reads one of fakepush's JSON endpoints into v.
func (b *Benchmark) getFake(ctx context.Context, path string, v any) error {
	resp, err := b.fakeGet(ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// fakeGet asks fakepush's control endpoint path, and returns its answer
// when it is a 200.
func (b *Benchmark) fakeGet(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.fakeURL+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.fakeHTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fakepush %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("fakepush %s: %s", path, resp.Status)
	}
	return resp, nil
}
