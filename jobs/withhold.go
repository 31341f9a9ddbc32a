package jobs

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/jobs/push"
)

// ruleOf is a chunk's rule (jobs/preferences) as db.BeginChunk read it.
func ruleOf(r db.ChunkRulesRow) preferences.Rule {
	rule := preferences.Rule{
		Category: r.Category, Critical: r.Critical, CapCount: r.CapCount, CapS: r.CapPeriodS,
		Mode: r.QuietHours, DefaultZone: r.DefaultTimezone,
	}
	rule.Default, rule.HasDefault = preferences.WindowOf(r.QuietStart, r.QuietEnd)
	return rule
}

// withhold decides, at now (the database's clock), what each delivery the
// chunk may send now is owed by its user's preferences (jobs/preferences):
// opted out (cancelled), inside quiet hours (held until they end, skipped,
// or expired when they outlast the message), or past the category's cap
// (cancelled). The cap is claimed, through pool, for the users of the
// deliveries that are left, in one statement; a user the message reaches
// on several devices counts once. Nothing is written to the ledger here:
// gone writes what was decided, with the chunk's other results.
func withhold(ctx context.Context, c *running, pool *pgxpool.Pool, now time.Time) error {
	if c.Rule.Critical {
		return nil
	}
	var capped []int
	for i := range c.Targets {
		t := &c.Targets[i]
		if !t.sendable(now) {
			continue
		}
		switch d := preferences.Decide(c.Rule, t.Prefs, now, c.ExpiresAt); d.Verdict {
		case preferences.OptedOut:
			t.Gone = push.ReasonOptedOut
		case preferences.Skipped:
			t.Gone = push.ReasonQuietHours
		case preferences.Expired:
			t.Gone, t.Expires = push.ReasonQuietHours, true
		case preferences.Held:
			t.NotBefore, t.Held = d.Until, true
		default:
			if c.Rule.Capped() {
				capped = append(capped, i)
			}
		}
	}
	if len(capped) == 0 {
		return nil
	}
	users := make([]string, len(capped))
	for j, i := range capped {
		users[j] = c.Targets[i].UserID
	}
	over, err := db.ClaimFrequencyCaps(ctx, pool, db.CategoryCap{Category: c.Rule.Category, Count: c.Rule.CapCount, PeriodS: c.Rule.CapS}, c.MessageID, users)
	if err != nil {
		return err
	}
	for _, i := range capped {
		if over[c.Targets[i].UserID] {
			c.Targets[i].Gone = push.ReasonCapped
		}
	}
	return nil
}

// heldAt is how many of the chunk's deliveries wait for their users' quiet
// hours to end after an attempt that began at now: those it held, and
// those an earlier attempt held whose hours had not ended when it began.
func heldAt(c *running, now time.Time) int32 {
	var n int32
	for _, t := range c.Targets {
		if t.Held || (t.Gone == push.ReasonNone && !t.DueAt.IsZero() && t.NotBefore.After(now)) {
			n++
		}
	}
	return n
}
