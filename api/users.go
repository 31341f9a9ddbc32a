package api

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// userRequest is the whole of a user as a caller sets it. A missing or null
// timezone or locale clears it, as PUT replaces the resource.
type userRequest struct {
	Timezone *string `json:"timezone"`
	// Locale is a BCP 47 tag ("de-AT"), kept in canonical case; it picks
	// each message's localization for the user's devices.
	Locale *string `json:"locale"`
}

func (r *userRequest) validate() error {
	if r.Timezone != nil {
		if err := checkTimezone("timezone", *r.Timezone); err != nil {
			return err
		}
	}
	if r.Locale != nil {
		locale, err := push.CanonicalLocale(*r.Locale)
		if err != nil {
			return invalid("locale", "locale: %v", err)
		}
		r.Locale = &locale
	}
	return nil
}

type userResponse struct {
	UserID   string  `json:"user_id"`
	Timezone *string `json:"timezone"`
	Locale   *string `json:"locale"`
}

// putUser creates or updates a user. Users are also created implicitly by
// device registration and segment membership; this is where their time zone
// and locale are set.
func (s *Server) putUser(c echo.Context) error {
	userID := c.Param("user_id")
	if err := checkID("user_id", userID); err != nil {
		return err
	}
	var req userRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	row, err := db.On(s.pool).UpsertUser(c.Request().Context(), db.UpsertUserParams{
		ID: userID, Timezone: req.Timezone, Locale: req.Locale,
	})
	if err != nil {
		return fmt.Errorf("put user: %w", err)
	}
	status := http.StatusOK
	if row.Created {
		status = http.StatusCreated
	}
	return c.JSON(status, userResponse{UserID: row.ID, Timezone: row.Timezone, Locale: row.Locale})
}
