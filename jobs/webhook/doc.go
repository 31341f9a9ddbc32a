// Package webhook is how Herald posts to a caller's webhook: the body of a
// batch of events (Batch), its signature in the Standard Webhooks form
// (NewSecret, Sign) and the HTTP client that keeps to the egress policy
// (Policy: public addresses only, unless the operator trusts a host). It
// knows nothing of the database; jobs' WebhookWorker sends through it.
package webhook
