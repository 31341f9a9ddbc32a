package jobs

import (
	"fmt"
	"time"
)

// errRequired is the error of a service's configuration that lacks field
// (named as Type.Field), without which the service cannot work.
func errRequired(field string) error {
	return fmt.Errorf("jobs: %s is required", field)
}

// errNegative is the error of a configuration whose duration field is
// negative: zero takes the default, and no negative one means anything.
func errNegative(field string, d time.Duration) error {
	return fmt.Errorf("jobs: %s is %s; it must not be negative (zero takes the default)", field, d)
}

// serviceConfig is a background service's configuration: withDefaults fills
// the settings left zero, validate names the first that cannot work.
type serviceConfig[C any] interface {
	*C
	withDefaults()
	validate() error
}

// configure is the one way a service's constructor takes its configuration:
// a copy of cfg (the caller's is left as it was) with its defaults filled
// once, then validated.
func configure[C any, P serviceConfig[C]](cfg *C) (C, error) {
	c := *cfg
	P(&c).withDefaults()
	return c, P(&c).validate()
}
