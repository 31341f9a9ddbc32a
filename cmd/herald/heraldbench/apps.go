package heraldbench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// extraApps are the names of the apps beside the default one (--apps).
func (b *Benchmark) extraApps() []string {
	var names []string
	for i := 1; i < b.Config.Apps; i++ {
		names = append(names, "bench-app-"+strconv.Itoa(i))
	}
	return names
}

// randomSealKey is a HERALD_SECRET_KEY for the run's Herald.
func randomSealKey() string {
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	return base64.StdEncoding.EncodeToString(raw)
}

// appOf is the app of user u's devices: the users are dealt round the
// apps, the default app first.
func (b *Benchmark) appOf(u int) *fake.App {
	if n := len(b.fakeApps) + 1; u%n != 0 {
		return &b.fakeApps[u%n-1]
	}
	return nil
}

// storeApps makes the extra apps in Herald with fakepush's credentials for
// them on every channel, and waits until each worker has their clients.
func (b *Benchmark) storeApps(ctx context.Context) error {
	for _, a := range b.fakeApps {
		res, err := b.api.CreateAppWithResponse(ctx, client.NewApp{Name: a.Name})
		if err := answered("create app "+a.Name, http.StatusCreated, res, err); err != nil {
			return err
		}
		for _, in := range []client.NewCredential{
			{Apns: &client.APNsCredential{KeyID: a.APNs.KeyID, TeamID: a.APNs.TeamID, Topic: a.APNs.Topic, Key: a.APNs.KeyPEM}},
			{Fcm: &client.FCMCredential{ServiceAccount: a.FCM.ServiceAccountJSON}},
			{Webpush: &client.WebPushCredential{PublicKey: a.WebPush.PublicKey, PrivateKey: a.WebPush.PrivateKey, Subject: a.WebPush.Subject}},
		} {
			res, err := b.api.CreateAppCredentialWithResponse(ctx, a.Name, in)
			if err := answered("store app "+a.Name+"'s credentials", http.StatusCreated, res, err); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(time.Minute)
	for _, a := range b.fakeApps {
		for {
			res, err := b.api.GetAppWithResponse(ctx, a.Name)
			if err := answered("read app "+a.Name, http.StatusOK, res, err); err != nil {
				return err
			}
			ready := res.JSON200.Health != nil
			for _, ch := range []string{"apns", "fcm", "webpush"} {
				ready = ready && (*res.JSON200.Health)[ch].Workers >= b.workerProcesses()
			}
			if ready {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("app %s's clients were not built by every worker within a minute", a.Name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if len(b.fakeApps) > 0 {
		b.Progress("apps: %d beside the default one, their credentials on every worker", len(b.fakeApps))
	}
	return nil
}

// declareAppTokens tells fakepush which app each of the population's APNs
// and FCM tokens is of, as Apple and Google know them.
func (b *Benchmark) declareAppTokens(devices []client.DeviceRegistration) error {
	byApp := map[string]map[string][]string{}
	for _, d := range devices {
		if d.App == nil || d.Token == nil {
			continue
		}
		if byApp[*d.App] == nil {
			byApp[*d.App] = map[string][]string{}
		}
		byApp[*d.App][string(d.Channel)] = append(byApp[*d.App][string(d.Channel)], *d.Token)
	}
	for app, channels := range byApp {
		for channel, tokens := range channels {
			body, err := json.Marshal(fake.AppTokens{Channel: channel, Tokens: tokens})
			if err != nil {
				return err
			}
			resp, err := b.fakeHTTP.Post(b.fakeURL+"/_apps/"+app+"/tokens", "application/json", bytes.NewReader(body))
			if err != nil {
				return fmt.Errorf("declare app %s's tokens: %w", app, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				return fmt.Errorf("declare app %s's tokens: %s", app, resp.Status)
			}
		}
	}
	return nil
}
