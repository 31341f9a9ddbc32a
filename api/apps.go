package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
)

// appView is an app as /v1/apps shows it: its credentials' public parts
// (never a private key, a service account's key or a VAPID private key),
// and the VAPID key its pages subscribe with.
type appView struct {
	apps.App
	VAPIDPublicKey *string `json:"vapid_public_key"`
	// Health is what the worker processes report of the app's channels
	// (the last 10 s): how many have a client for it, their breakers, and
	// the pushes the provider refused for the app's credentials.
	Health map[string]*appHealth `json:"health"`
}

// appHealth is one channel of an app as the workers see it.
type appHealth struct {
	// Workers counts the workers that reported a client for the channel
	// (of any of the app's credentials).
	Workers     int        `json:"workers"`
	State       string     `json:"state"`
	Sends       int64      `json:"sends"`
	Failures    int64      `json:"failures"`
	LastError   *string    `json:"last_error"`
	LastErrorAt *time.Time `json:"last_error_at"`
	// Refused counts the pushes the provider refused for the app's
	// credentials (reason credentials_refused) since the workers started.
	Refused       int64      `json:"refused"`
	LastRefused   *string    `json:"last_refused"`
	LastRefusedAt *time.Time `json:"last_refused_at"`
}

// health reads what the workers report of every app's channels.
func (s *Server) health(ctx context.Context) (map[int32]map[string]*appHealth, error) {
	rows, err := db.On(s.pool).FreshAppProviderStatus(ctx, providerStatusMaxAge.Seconds())
	if err != nil {
		return nil, fmt.Errorf("read app provider status: %w", err)
	}
	out := map[int32]map[string]*appHealth{}
	for _, r := range rows {
		byChannel := out[r.AppID]
		if byChannel == nil {
			byChannel = map[string]*appHealth{}
			out[r.AppID] = byChannel
		}
		h := byChannel[r.Channel]
		if h == nil {
			h = &appHealth{State: jobs.BreakerClosed}
			byChannel[r.Channel] = h
		}
		if r.Configured {
			h.Workers++
		}
		h.Sends += r.Sends
		h.Failures += r.Failures
		h.Refused += r.Refused
		h.State = jobs.WorseState(h.State, r.State)
		if r.LastErrorAt != nil && (h.LastErrorAt == nil || r.LastErrorAt.After(*h.LastErrorAt)) {
			h.LastError, h.LastErrorAt = scrubbed(r.LastError), utcPtr(r.LastErrorAt)
		}
		if r.LastRefusedAt != nil && (h.LastRefusedAt == nil || r.LastRefusedAt.After(*h.LastRefusedAt)) {
			h.LastRefused, h.LastRefusedAt = scrubbed(r.LastRefused), utcPtr(r.LastRefusedAt)
		}
	}
	return out, nil
}

func (s *Server) appView(a apps.App, health map[int32]map[string]*appHealth) appView {
	v := appView{App: a, Health: map[string]*appHealth{}}
	if s.cfg.Apps != nil {
		if k, _, ok := s.cfg.Apps.WebPushKey(a.ID); ok {
			v.VAPIDPublicKey = &k
		}
	}
	for _, ch := range apps.Channels {
		v.Health[ch] = &appHealth{State: jobs.BreakerClosed}
		if h := health[a.ID][ch]; h != nil {
			v.Health[ch] = h
		}
	}
	return v
}

type appList struct {
	Items []appView `json:"items"`
}

// listApps lists every app with its channels.
func (s *Server) listApps(c echo.Context) error {
	all, err := s.cfg.AppStore.List(c.Request().Context(), s.pool)
	if err != nil {
		return err
	}
	health, err := s.health(c.Request().Context())
	if err != nil {
		return err
	}
	who := callerOf(c.Request().Context())
	out := appList{Items: make([]appView, 0, len(all))}
	for _, a := range all {
		if who.mayActFor(a.ID) {
			out.Items = append(out.Items, s.appView(a, health))
		}
	}
	return c.JSON(http.StatusOK, out)
}

// appFor is the app named by the route, when the caller may act for it; a
// key limited to other apps is told it does not exist.
func (s *Server) appFor(c echo.Context) (apps.App, error) {
	name := c.Param("app")
	setAuditApp(c, name)
	if apps.CheckName(name) != nil {
		return apps.App{}, notFound("app", name)
	}
	a, err := s.cfg.AppStore.Get(c.Request().Context(), s.pool, name)
	if err != nil {
		return apps.App{}, err
	}
	if !callerOf(c.Request().Context()).mayActFor(a.ID) {
		return apps.App{}, notFound("app", name)
	}
	return a, nil
}

func (s *Server) getApp(c echo.Context) error {
	a, err := s.appFor(c)
	if err != nil {
		return err
	}
	health, err := s.health(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.appView(a, health))
}

type createAppRequest struct {
	Name string `json:"name"`
}

func (r *createAppRequest) validate() error {
	if r.Name == "" {
		return invalid("name", "name is required")
	}
	return apps.CheckName(r.Name)
}

// createApp makes an app (201), or answers the one of that name (200).
func (s *Server) createApp(c echo.Context) error {
	var req createAppRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	setAuditApp(c, req.Name)
	if who := callerOf(c.Request().Context()); who.apps != nil {
		return &Error{Status: http.StatusForbidden, Code: "forbidden",
			Message: "key " + strconv.Quote(who.key) + " is limited to some apps and cannot make others"}
	}
	a, created, err := s.cfg.AppStore.Create(c.Request().Context(), req.Name)
	if err != nil {
		return err
	}
	setAuditTarget(c, a.Name)
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, s.appView(a, nil))
}

type patchAppRequest struct {
	Disabled *bool `json:"disabled"`
}

func (r *patchAppRequest) validate() error {
	if r.Disabled == nil {
		return invalid("disabled", "disabled (true or false) is the one field an app's PATCH takes")
	}
	return nil
}

// patchApp disables an app (its devices are sent nothing, their
// deliveries fail channel_disabled) or enables it again.
func (s *Server) patchApp(c echo.Context) error {
	var req patchAppRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	a, err := s.appFor(c)
	if err != nil {
		return err
	}
	setAuditTarget(c, a.Name)
	a, err = s.cfg.AppStore.SetDisabled(c.Request().Context(), s.pool, a.Name, *req.Disabled)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.appView(a, nil))
}

type credentialRequest struct {
	apps.Input
}

func (r *credentialRequest) validate() error { return r.Check() }

// putCredential stores a new credential for one of the app's channels and
// makes it the one its sends use, on every process within a second or
// two; the one before is retired (for Web Push, kept for the
// subscriptions made with its key). The private part is sealed before it
// is stored and is never answered.
func (s *Server) putCredential(c echo.Context) error {
	var req credentialRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	a, err := s.appFor(c)
	if err != nil {
		return err
	}
	channel, _ := req.Channel()
	info, err := s.cfg.AppStore.Rotate(c.Request().Context(), a.Name, req.Input)
	if err != nil {
		return err
	}
	setAuditTarget(c, channel+"/"+strconv.Itoa(int(info.Version)))
	return c.JSON(http.StatusCreated, credentialView{Channel: channel, CredentialInfo: info})
}

type credentialView struct {
	Channel string `json:"channel"`
	apps.CredentialInfo
}

type retiredList struct {
	Retired []credentialView `json:"retired"`
}

// retireCredentials retires an app's credentials of a channel: the one of
// ?version=, or every live one. The app's sends on the channel then fail
// with channel_disabled, unless another credential is active (or, for the
// default app, the environment has one).
func (s *Server) retireCredentials(c echo.Context) error {
	a, err := s.appFor(c)
	if err != nil {
		return err
	}
	channel := c.Param("channel")
	var version int32
	if v := c.QueryParam("version"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			return invalid("version", "version must be a credential's version, a whole number from 1")
		}
		version = int32(n)
	}
	retired, err := s.cfg.AppStore.Retire(c.Request().Context(), a.Name, channel, version)
	if err != nil {
		return err
	}
	setAuditTarget(c, channel)
	out := retiredList{Retired: make([]credentialView, 0, len(retired))}
	for _, r := range retired {
		out.Retired = append(out.Retired, credentialView{Channel: channel, CredentialInfo: r})
	}
	return c.JSON(http.StatusOK, out)
}
