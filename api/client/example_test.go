package client_test

import (
	"context"
	"fmt"

	"github.com/heraldpush/herald/api/client"
)

// The example of docs/go.md: schedule a message to one user now. It is
// compiled, not run (there is no Herald to call here); the end-to-end tests
// in cmd/herald run every operation through the client.
func ExampleClientWithResponses_CreateMessageWithResponse() {
	ctx, key := context.Background(), "the API key"
	c, err := client.NewClientWithResponses("http://127.0.0.1:8080", client.WithAPIKey(key))
	if err != nil {
		panic(err)
	}
	res, err := c.CreateMessageWithResponse(ctx, nil, client.NewMessage{
		Audience: client.Audience{Type: client.AudienceTypeUsers, IDs: &[]string{"ann"}},
		Payload:  client.Payload{Title: new("Standup")},
	})
	if err != nil {
		panic(err)
	}
	switch {
	case res.JSON202 != nil:
		fmt.Println("scheduled", res.JSON202.MessageID, "to", res.JSON202.DeviceCount, "devices")
	case res.JSON400 != nil:
		fmt.Println("refused:", res.JSON400.Error.Message)
	default:
		fmt.Println("answered", res.Status())
	}
}
