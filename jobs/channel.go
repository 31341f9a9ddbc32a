package jobs

import "github.com/heraldpush/herald/jobs/apps"

// The channels Herald sends through, named once, where an app's
// credentials are kept (jobs/apps).
const (
	ChannelAPNs    = apps.ChannelAPNs
	ChannelFCM     = apps.ChannelFCM
	ChannelWebPush = apps.ChannelWebPush
)

// Channels Herald sends through, in the order status is reported.
var Channels = apps.Channels
