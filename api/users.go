package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
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

// userDetail is a user as GET /v1/users/{id} shows it.
type userDetail struct {
	UserID   string  `json:"user_id"`
	Timezone *string `json:"timezone"`
	Locale   *string `json:"locale"`
	// DeviceCount counts every device of the user (GET .../devices lists
	// them); ActiveDeviceCount those messages go to (not evicted).
	DeviceCount       int32     `json:"device_count"`
	ActiveDeviceCount int32     `json:"active_device_count"`
	CreatedAt         time.Time `json:"created_at"`
	UpdatedAt         time.Time `json:"updated_at"`
}

func (s *Server) getUser(c echo.Context) error {
	u, err := fromPath(c, "user_id", "user", callerID, db.On(s.pool).GetUser)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, userDetail{
		UserID: u.ID, Timezone: u.Timezone, Locale: u.Locale, DeviceCount: u.DeviceCount, ActiveDeviceCount: u.ActiveDeviceCount,
		CreatedAt: u.CreatedAt.UTC(), UpdatedAt: u.UpdatedAt.UTC(),
	})
}

// deleteUser erases a user: its devices (their tokens and keys, also from
// the chunk jobs River keeps), its memberships, its time zone and the user
// itself, in one transaction. What was still pending for its devices is
// cancelled; the ledger keeps its settled rows, which hold no token.
func (s *Server) deleteUser(c echo.Context) error {
	ctx := c.Request().Context()
	userID := c.Param("user_id")
	if checkID("user_id", userID) != nil {
		return notFound("user", userID)
	}
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		// The user first: registrations for it wait, so its list of
		// devices is whole.
		if _, err := q.LockUser(ctx, userID); err != nil {
			if errors.Is(err, db.ErrNotFound) {
				return notFound("user", userID)
			}
			return fmt.Errorf("lock user: %w", err)
		}
		devices, err := q.UserDeviceIDs(ctx, userID)
		if err != nil {
			return fmt.Errorf("find devices: %w", err)
		}
		if err := db.EraseDevices(ctx, tx, devices); err != nil {
			return err
		}
		if _, err := q.DeleteUserDevices(ctx, userID); err != nil {
			return fmt.Errorf("delete devices: %w", err)
		}
		if _, err := q.DeleteUserMemberships(ctx, userID); err != nil {
			return fmt.Errorf("delete memberships: %w", err)
		}
		if _, err := q.DeleteUser(ctx, userID); err != nil {
			return fmt.Errorf("delete user: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
