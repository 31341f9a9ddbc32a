package api

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"time"
)

// refreshEvery is how often at most a process does the work behind an
// unauthenticated endpoint that reads the database (/readyz) or gathers
// every metric (/metrics): anyone can call them, as often as they like, so
// each answer is the last one made within this time. A flood of them cost
// the database a query each, and took typical API latency from 2.6 ms to
// 252 ms.
const refreshEvery = time.Second

// recentCheck runs check at most once every refreshEvery and answers
// every caller in between with its last result; callers that come while it
// runs wait for it rather than run it again.
type recentCheck struct {
	check func(ctx context.Context) error
	now   func() time.Time

	mu  sync.Mutex
	at  time.Time
	err error
}

func newRecentCheck(check func(ctx context.Context) error) *recentCheck {
	return &recentCheck{check: check, now: time.Now}
}

// result is check's last result, made anew if it is older than
// refreshEvery. The check runs without the caller's context, bounded by
// refreshEvery plus a little: one caller going away must not fail the
// answer every other caller shares.
func (r *recentCheck) result() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && r.now().Sub(r.at) < refreshEvery {
		return r.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*refreshEvery)
	defer cancel()
	r.err, r.at = r.check(ctx), r.now()
	return r.err
}

// recentPage serves h's answer, made at most once every refreshEvery per
// kind of request (its Accept and Accept-Encoding headers, which choose the
// format and compression of a metrics page), to every caller in between.
type recentPage struct {
	h   http.Handler
	now func() time.Time

	mu    sync.Mutex
	pages map[string]*keptPage
}

// keptPage is one answer kept: its status, headers and body, and when it was
// made.
type keptPage struct {
	at     time.Time
	status int
	header http.Header
	body   []byte
}

func newRecentPage(h http.Handler) *recentPage {
	return &recentPage{h: h, now: time.Now, pages: map[string]*keptPage{}}
}

func (p *recentPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Accept") + "\x00" + r.Header.Get("Accept-Encoding")
	p.mu.Lock()
	pg, ok := p.pages[key]
	if !ok || p.now().Sub(pg.at) >= refreshEvery {
		rec := &pageRecorder{header: http.Header{}, status: http.StatusOK}
		p.h.ServeHTTP(rec, r)
		pg = &keptPage{at: p.now(), status: rec.status, header: rec.header, body: rec.body.Bytes()}
		// Kinds of request are few (a scraper sends one); a caller who
		// makes up headers only ever replaces the pages kept.
		if len(p.pages) >= 8 {
			clear(p.pages)
		}
		p.pages[key] = pg
	}
	p.mu.Unlock()
	for k, v := range pg.header {
		w.Header()[k] = v
	}
	w.WriteHeader(pg.status)
	_, _ = w.Write(pg.body)
}

// pageRecorder keeps an answer to serve again.
type pageRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *pageRecorder) Header() http.Header         { return r.header }
func (r *pageRecorder) WriteHeader(status int)      { r.status = status }
func (r *pageRecorder) Write(b []byte) (int, error) { return r.body.Write(b) }
