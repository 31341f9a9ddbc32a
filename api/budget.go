package api

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"
	"golang.org/x/sync/semaphore"
)

// DefaultBodyBudget is how many bytes of request bodies a process reads at
// once (Config.BodyBudget): two of the largest batches. A body is held
// while it is decoded, and decoding takes a few times its size, so sixteen
// 16 MB batches at once, each refused at its last device, took a process
// from 47 MB to 1.6 GB before there was a budget.
const DefaultBodyBudget = 32 << 20

// budgetKey is where a request's hold on the body budget is kept in its
// Echo context.
const budgetKey = "herald.bodyBudget"

// bodyBudget bounds the request body bytes a process holds at once. A
// request takes its body's declared length (or its route's limit, for a
// body of unknown length) before the body is read; one that does not fit
// is refused at once with 503 and Retry-After, its body unread, and the
// caller tries again a moment later. What a request took is given back
// when it has been answered.
type bodyBudget struct {
	sem  *semaphore.Weighted
	size int64
}

func newBodyBudget(size int64) *bodyBudget {
	return &bodyBudget{sem: semaphore.NewWeighted(size), size: size}
}

// hold is one request's part of the budget.
type hold struct {
	b     *bodyBudget
	taken int64
}

// middleware gives each request a hold, released once it is answered.
func (b *bodyBudget) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := &hold{b: b}
		c.Set(budgetKey, h)
		defer func() {
			if h.taken > 0 {
				b.sem.Release(h.taken)
			}
		}()
		return next(c)
	}
}

// takeBody takes n bytes of the process's body budget for c's body, or
// refuses the request. A request without a hold (a server built without a
// budget) takes nothing.
func takeBody(c echo.Context, n int64) error {
	h, _ := c.Get(budgetKey).(*hold)
	if h == nil || n <= 0 {
		return nil
	}
	n = min(n, h.b.size)
	if !h.b.sem.TryAcquire(n) {
		c.Response().Header().Set("Retry-After", "1")
		return &Error{Status: http.StatusServiceUnavailable, Code: "overloaded",
			Message: fmt.Sprintf("this process is reading as many request bodies as it may at once (%d bytes); try again in a second", h.b.size)}
	}
	h.taken += n
	return nil
}
