package fcm

import (
	"context"

	"github.com/heraldpush/herald/jobs/push"
)

// WarmFor opens, ahead of an instant, what a send to targets will use: FCM
// is one host, so it is Warm's whatever the targets are (an access token,
// which expires after an hour and would otherwise be fetched by the
// instant's first push, and every connection of the pool); nothing when
// there are none. The pool keeps what it opened: nothing closes an idle
// connection on Herald's side.
func (p *Provider) WarmFor(ctx context.Context, targets []push.Target) error {
	if len(targets) == 0 {
		return nil
	}
	return p.Warm(ctx)
}
