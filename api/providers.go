package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// providerStatusMaxAge is how recent a worker's report must be to count;
// workers report every 2 s.
const providerStatusMaxAge = 10 * time.Second

type providerStatus struct {
	Configured  bool       `json:"configured"`
	State       string     `json:"state"`
	LastError   *string    `json:"last_error"`
	LastErrorAt *time.Time `json:"last_error_at"`
	// Workers is how many worker processes reported on this channel
	// recently; zero means no worker is running and the state is unknown
	// beyond "closed".
	Workers int `json:"workers"`
	// Sends and Failures are the reporting workers' attempted sends and
	// transient failures since they started.
	Sends    int64 `json:"sends"`
	Failures int64 `json:"failures"`
}

// listProviders reports, per channel, whether it is configured and what the
// worker processes' circuit breakers say about it.
func (s *Server) listProviders(c echo.Context) error {
	rows, err := db.On(s.pool).FreshProviderStatus(c.Request().Context(), providerStatusMaxAge.Seconds())
	if err != nil {
		return fmt.Errorf("read provider status: %w", err)
	}
	out := make(map[string]*providerStatus, len(jobs.Channels))
	for _, ch := range jobs.Channels {
		out[ch] = &providerStatus{Configured: s.cfg.Configured[ch], State: jobs.BreakerClosed}
	}
	for _, r := range rows {
		st, ok := out[r.Channel]
		if !ok || !r.Configured {
			continue
		}
		st.Configured = true
		st.Workers++
		st.Sends += r.Sends
		st.Failures += r.Failures
		// One open breaker in any worker shows.
		st.State = jobs.WorseState(st.State, r.State)
		if r.LastErrorAt != nil && (st.LastErrorAt == nil || r.LastErrorAt.After(*st.LastErrorAt)) {
			st.LastError, st.LastErrorAt = scrubbed(r.LastError), utcPtr(r.LastErrorAt)
		}
	}
	return c.JSON(http.StatusOK, out)
}

// scrubbed is a stored last error as it is shown: without any URL's path
// (push.ScrubDetail), for the rows an older Herald wrote, whose errors
// could quote a Web Push endpoint, a device's token.
func scrubbed(lastError *string) *string {
	if lastError == nil {
		return nil
	}
	s := push.ScrubDetail(*lastError)
	return &s
}
