package api

import "github.com/labstack/echo/v4"

// routes lists every route Herald serves, in one place.
func (s *Server) routes() {
	e := s.echo
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/openapi.yaml", s.openapi)
	if s.cfg.Metrics != nil {
		e.GET("/metrics", echo.WrapHandler(s.cfg.Metrics))
	}
	if s.cfg.WorkerOnly {
		return
	}

	v1 := e.Group("/v1", s.keys.requireAPIKey)

	// Directory.
	v1.POST("/devices", s.registerDevice)
	v1.POST("/devices/batch", s.registerDevices)
	v1.DELETE("/devices/:device_id", s.deleteDevice)
	v1.PUT("/users/:user_id", s.putUser)
	v1.GET("/users/:user_id/devices", s.listUserDevices)
	v1.PUT("/segments/:segment_id", s.putSegment)
	v1.GET("/segments/:segment_id", s.getSegment)
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
}
