package api

import "github.com/labstack/echo/v4"

// The probes' paths, which every role serves on its listener: liveness
// (the process answers) and readiness (its database answers and is
// migrated). deploy/'s manifests name them, and a test holds them to these.
const (
	HealthPath = "/healthz"
	ReadyPath  = "/readyz"
)

// routes lists every route Herald serves, in one place.
func (s *Server) routes() {
	e := s.echo
	e.GET(HealthPath, s.healthz)
	e.GET(ReadyPath, s.readyz)
	e.GET("/openapi.yaml", s.openapi)
	if s.cfg.Metrics != nil {
		e.GET("/metrics", echo.WrapHandler(newRecentPage(s.cfg.Metrics)))
	}
	if s.cfg.WorkerOnly {
		return
	}

	// What a device may call takes no API key (public.go); a public
	// listener serves it alone.
	s.deviceRoutes(e)

	// Each caller's requests are limited after it is known: a flood with
	// one key is refused without slowing another. What a call changes is
	// then recorded (audit.go), refused by scope or not; each route names
	// the scope it needs (auth.go).
	v1 := e.Group("/v1", s.requireAPIKey, s.limiter.limit, s.audit)
	read, send, admin := needs(ScopeRead), needs(ScopeSend), needs(ScopeAdmin)

	// Directory. Erasing a user or a segment needs admin.
	v1.POST("/devices", s.registerDevice, send)
	v1.POST("/devices/batch", s.registerDevices, send)
	v1.DELETE("/devices/:device_id", s.deleteDevice, send)
	v1.PUT("/users/:user_id", s.putUser, send)
	v1.GET("/users/:user_id", s.getUser, read)
	v1.DELETE("/users/:user_id", s.deleteUser, admin)
	v1.GET("/users/:user_id/devices", s.listUserDevices, read)
	v1.GET("/users/:user_id/preferences", s.getUserPreferences, read)
	v1.PUT("/users/:user_id/preferences", s.putUserPreferences, send)
	v1.GET("/segments", s.listSegments, read)
	v1.PUT("/segments/:segment_id", s.putSegment, send)
	v1.GET("/segments/:segment_id", s.getSegment, read)
	v1.DELETE("/segments/:segment_id", s.deleteSegment, admin)
	v1.GET("/segments/:segment_id/members", s.listSegmentMembers, read)
	v1.POST("/segments/:segment_id/members", s.addMembers, send)
	v1.DELETE("/segments/:segment_id/members", s.removeMembers, send)

	// A link to a user's own preferences form, for the app to open on the
	// phone (preferenceform.go): the form's routes are device routes.
	v1.POST("/users/:user_id/preferences/link", s.createPreferencesLink, send)

	// Messages.
	v1.POST("/messages", s.createMessage, send)
	v1.GET("/messages", s.listMessages, read)
	v1.GET("/messages/:message_id", s.getMessage, read)
	v1.DELETE("/messages/:message_id", s.cancelMessage, send)
	v1.GET("/messages/:message_id/deliveries", s.listDeliveries, read)
	v1.GET("/messages/:message_id/apps", s.messageApps, read)

	// Recurring reminders.
	v1.POST("/schedules", s.createSchedule, send)
	v1.GET("/schedules", s.listSchedules, read)
	v1.GET("/schedules/:schedule_id", s.getSchedule, read)
	v1.PATCH("/schedules/:schedule_id", s.patchSchedule, send)
	v1.DELETE("/schedules/:schedule_id", s.deleteSchedule, send)

	// What the people reminded are owed (preferences.go): users' own
	// preferences are set as users are, while categories and the
	// installation's quiet hours bind every app's messages, so they are
	// configured as apps are, by a key limited to no app.
	configure := []echo.MiddlewareFunc{needs(ScopeApps), everyApp}
	v1.GET("/categories", s.listCategories, read)
	v1.GET("/categories/:category", s.getCategory, read)
	v1.PUT("/categories/:category", s.putCategory, configure...)
	v1.DELETE("/categories/:category", s.deleteCategory, configure...)
	v1.GET("/quiet-hours", s.getQuietHours, read)
	v1.PUT("/quiet-hours", s.putQuietHours, configure...)
	v1.DELETE("/quiet-hours", s.deleteQuietHours, configure...)

	// Operations.
	v1.GET("/providers", s.listProviders, read)

	// Apps and their credentials (apps.go): managing them needs scope
	// apps (or admin); their private parts are never answered.
	if s.cfg.AppStore != nil {
		manage := needs(ScopeApps)
		v1.GET("/apps", s.listApps, read)
		v1.POST("/apps", s.createApp, manage)
		v1.GET("/apps/:app", s.getApp, read)
		v1.PATCH("/apps/:app", s.patchApp, manage)
		v1.POST("/apps/:app/credentials", s.putCredential, manage)
		v1.DELETE("/apps/:app/credentials/:channel", s.retireCredentials, manage)
	}

	// Who may call, and what they did.
	v1.POST("/keys", s.createKey, admin)
	v1.GET("/keys", s.listKeys, admin)
	v1.DELETE("/keys/:key_name", s.revokeKey, admin)
	v1.GET("/audit", s.listAudit, admin)

	// Where Herald posts what happened (webhooks.go): their secrets sign
	// the calls, so they are an admin's.
	v1.POST("/webhooks", s.createWebhook, admin)
	v1.GET("/webhooks", s.listWebhooks, admin)
	v1.GET("/webhooks/:webhook_id", s.getWebhook, admin)
	v1.DELETE("/webhooks/:webhook_id", s.deleteWebhook, admin)

	s.dashboardRoutes()
}

// dashboardRoutes serves the operators' pages: the dashboard (package web)
// and River UI, behind an operator's session (session.go). The dashboard's
// data comes from the /v1 handlers mounted a second time under /ui/api, with
// the session and its CSRF token in place of an API key, so that no key ever
// reaches a browser; what an operator changes there is recorded as /v1's
// calls are.
func (s *Server) dashboardRoutes() {
	e := s.echo
	same := sameOrigin()
	e.GET("/login", s.loginPage)
	e.POST("/login", s.login, same, limitBody(loginBodyLimit))
	e.POST("/logout", s.logout, same)
	e.GET("/", s.dashboardIndex, s.requireSession)
	e.GET("/assets/*", s.assets())

	ui := e.Group("/ui/api", same, s.requireSession, s.requireCSRF, s.limiter.limit, s.audit)
	ui.GET("/session", s.sessionInfo)
	ui.POST("/messages", s.createMessage)
	ui.GET("/messages", s.listMessages)
	ui.GET("/messages/:message_id", s.getMessage)
	ui.DELETE("/messages/:message_id", s.cancelMessage)
	ui.GET("/messages/:message_id/deliveries", s.listDeliveries)
	ui.GET("/messages/:message_id/apps", s.messageApps)
	ui.GET("/messages/:message_id/breakdown", s.messageBreakdown)
	ui.GET("/slo", s.sloShare)
	ui.GET("/schedules", s.listSchedules)
	ui.GET("/schedules/:schedule_id", s.getSchedule)
	ui.PATCH("/schedules/:schedule_id", s.patchSchedule)
	ui.GET("/providers", s.listProviders)
	if s.cfg.AppStore != nil {
		ui.GET("/apps", s.listApps)
	}

	// River UI serves its pages and its API (/riverui/api/...) itself. Its
	// front end cannot send Herald's CSRF token, so its state-changing calls
	// (cancel, retry, delete, pause) rely on the session cookie being
	// SameSite=Strict and on the same-origin check; they are recorded as
	// the dashboard's are.
	e.Any("/riverui", s.riverUI, same, s.requireSession, s.audit)
	e.Any("/riverui/*", s.riverUI, same, s.requireSession, s.audit)
}
