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

	// Each caller's requests are limited after it is known: a flood with
	// one key is refused without slowing another.
	v1 := e.Group("/v1", s.keys.requireAPIKey, s.limiter.limit)

	// Directory.
	v1.POST("/devices", s.registerDevice)
	v1.POST("/devices/batch", s.registerDevices)
	v1.DELETE("/devices/:device_id", s.deleteDevice)
	v1.PUT("/users/:user_id", s.putUser)
	v1.GET("/users/:user_id", s.getUser)
	v1.DELETE("/users/:user_id", s.deleteUser)
	v1.GET("/users/:user_id/devices", s.listUserDevices)
	v1.GET("/segments", s.listSegments)
	v1.PUT("/segments/:segment_id", s.putSegment)
	v1.GET("/segments/:segment_id", s.getSegment)
	v1.DELETE("/segments/:segment_id", s.deleteSegment)
	v1.GET("/segments/:segment_id/members", s.listSegmentMembers)
	v1.POST("/segments/:segment_id/members", s.addMembers)
	v1.DELETE("/segments/:segment_id/members", s.removeMembers)

	// Messages.
	v1.POST("/messages", s.createMessage)
	v1.GET("/messages", s.listMessages)
	v1.GET("/messages/:message_id", s.getMessage)
	v1.DELETE("/messages/:message_id", s.cancelMessage)
	v1.GET("/messages/:message_id/deliveries", s.listDeliveries)

	// Recurring reminders.
	v1.POST("/schedules", s.createSchedule)
	v1.GET("/schedules", s.listSchedules)
	v1.GET("/schedules/:schedule_id", s.getSchedule)
	v1.PATCH("/schedules/:schedule_id", s.patchSchedule)
	v1.DELETE("/schedules/:schedule_id", s.deleteSchedule)

	// Operations.
	v1.GET("/providers", s.listProviders)

	s.dashboardRoutes()
}

// dashboardRoutes serves the operators' pages: the dashboard (package web)
// and River UI, behind user admin's session (session.go). The dashboard's
// data comes from the /v1 handlers mounted a second time under /ui/api, with
// the session and its CSRF token in place of an API key, so that no key ever
// reaches a browser.
func (s *Server) dashboardRoutes() {
	e := s.echo
	same := sameOrigin()
	e.GET("/login", s.loginPage, s.dashboardOn)
	e.POST("/login", s.login, s.dashboardOn, same, limitBody(loginBodyLimit))
	e.POST("/logout", s.logout, s.dashboardOn, same)
	e.GET("/", s.dashboardIndex, s.dashboardOn, s.requireSession)
	e.GET("/assets/*", s.assets(), s.dashboardOn)

	ui := e.Group("/ui/api", s.dashboardOn, same, s.requireSession, s.requireCSRF, s.limiter.limit)
	ui.GET("/session", s.sessionInfo)
	ui.POST("/messages", s.createMessage)
	ui.GET("/messages", s.listMessages)
	ui.GET("/messages/:message_id", s.getMessage)
	ui.DELETE("/messages/:message_id", s.cancelMessage)
	ui.GET("/messages/:message_id/deliveries", s.listDeliveries)
	ui.GET("/messages/:message_id/breakdown", s.messageBreakdown)
	ui.GET("/slo", s.sloShare)
	ui.GET("/schedules", s.listSchedules)
	ui.GET("/schedules/:schedule_id", s.getSchedule)
	ui.PATCH("/schedules/:schedule_id", s.patchSchedule)
	ui.GET("/providers", s.listProviders)

	// River UI serves its pages and its API (/riverui/api/...) itself. Its
	// front end cannot send Herald's CSRF token, so its state-changing calls
	// (cancel, retry, delete, pause) rely on the session cookie being
	// SameSite=Strict and on the same-origin check.
	e.Any("/riverui", s.riverUI, s.dashboardOn, same, s.requireSession)
	e.Any("/riverui/*", s.riverUI, s.dashboardOn, same, s.requireSession)
}
