// Package client is Herald's API from Go, generated from api/openapi.yaml by
// oapi-codegen (make generate; client.gen.go is never edited by hand): one
// method per operation, named after its operationId, and a type per schema.
// NewClientWithResponses gives typed answers (JSON201, JSON400, ...):
//
//	c, err := client.NewClientWithResponses("http://127.0.0.1:8080", client.WithAPIKey(key))
//	res, err := c.GetMessageWithResponse(ctx, "msg_42")
//	if res.JSON200 != nil { ... res.JSON200.Deliveries.Accepted ... }
package client

import (
	"context"
	"net/http"
)

// WithAPIKey sends key as the bearer token every /v1 call takes.
func WithAPIKey(key string) ClientOption {
	return WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+key)
		return nil
	})
}
