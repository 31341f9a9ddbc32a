package jobs

// The channels Herald sends through.
const (
	ChannelAPNs    = "apns"
	ChannelFCM     = "fcm"
	ChannelWebPush = "webpush"
)

// Channels Herald sends through, in the order status is reported.
var Channels = []string{ChannelAPNs, ChannelFCM, ChannelWebPush}
