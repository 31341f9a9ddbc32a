package api

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
)

// userRequest is the whole of a user as a caller sets it. A missing or null
// timezone clears it, as PUT replaces the resource.
type userRequest struct {
	Timezone *string `json:"timezone"`
}

func (r *userRequest) validate() error {
	if r.Timezone == nil {
		return nil
	}
	return checkTimezone("timezone", *r.Timezone)
}

type userResponse struct {
	UserID   string  `json:"user_id"`
	Timezone *string `json:"timezone"`
}

// putUser creates or updates a user. Users are also created implicitly by
// device registration and segment membership; this is where their time zone
// is set.
func (s *Server) putUser(c echo.Context) error {
	userID := c.Param("user_id")
	if err := checkID("user_id", userID); err != nil {
		return err
	}
	var req userRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	row, err := db.On(s.pool).UpsertUserTimezone(c.Request().Context(), db.UpsertUserTimezoneParams{
		ID: userID, Timezone: req.Timezone,
	})
	if err != nil {
		return fmt.Errorf("put user: %w", err)
	}
	status := http.StatusOK
	if row.Created {
		status = http.StatusCreated
	}
	return c.JSON(status, userResponse{UserID: row.ID, Timezone: row.Timezone})
}
