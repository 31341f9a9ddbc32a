package api

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/stretchr/testify/require"
)

var spec struct {
	once   sync.Once
	doc    *openapi3.T
	router routers.Router
	err    error
}

// openAPIRouter loads and validates the embedded document once.
func openAPIRouter(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	spec.once.Do(func() {
		loader := openapi3.NewLoader()
		spec.doc, spec.err = loader.LoadFromData(openAPI)
		if spec.err != nil {
			return
		}
		if spec.err = spec.doc.Validate(context.Background()); spec.err != nil {
			return
		}
		spec.router, spec.err = gorillamux.NewRouter(spec.doc)
	})
	require.NoError(t, spec.err)
	return spec.doc, spec.router
}

// checkAgainstSpec fails the test when a response does not match the
// OpenAPI document: every API test's calls go through it (bundle.call).
func checkAgainstSpec(t testing.TB, req *http.Request, rec *httptest.ResponseRecorder) {
	t.Helper()
	_, router := openAPIRouter(t)
	// The document's server is 127.0.0.1:8080; match the request to it.
	r := req.Clone(context.Background())
	r.URL.Scheme, r.URL.Host, r.Host = "http", "127.0.0.1:8080", "127.0.0.1:8080"
	route, params, err := router.FindRoute(r)
	if rec.Code >= 500 {
		return // an injected failure; 500s are never part of the contract
	}
	if err != nil {
		if rec.Code == http.StatusNotFound || rec.Code == http.StatusMethodNotAllowed {
			return // a route that does not exist, on purpose
		}
		t.Fatalf("%s %s is not in openapi.yaml: %v", req.Method, req.URL.Path, err)
	}
	in := &openapi3filter.RequestValidationInput{
		Request: r, PathParams: params, Route: route,
		Options: &openapi3filter.Options{ExcludeRequestBody: true, ExcludeRequestQueryParams: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 rec.Code,
		Header:                 rec.Header(),
		Body:                   io.NopCloser(bytes.NewReader(rec.Body.Bytes())),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Fatalf("%s %s answered %d not as openapi.yaml says: %v\nbody: %s", req.Method, req.URL.Path, rec.Code, err, rec.Body.String())
	}
}

var echoParam = regexp.MustCompile(`:([a-z_]+)`)

// TestEveryRouteIsDocumented checks that each route Echo serves is in
// openapi.yaml, and each documented operation is served.
func TestEveryRouteIsDocumented(t *testing.T) {
	t.Parallel()
	doc, _ := openAPIRouter(t)
	b := setup(t)
	served := map[string]bool{}
	for _, r := range b.srv.echo.Routes() {
		switch r.Method {
		case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		default:
			continue // Echo's own catch-alls
		}
		path := echoParam.ReplaceAllString(r.Path, "{$1}")
		// The preferences form is a page for people, as the dashboard's
		// are; what it calls is documented.
		if strings.HasSuffix(path, "/*") || dashboardRoute(path) || path == preferencesFormPath {
			continue
		}
		served[r.Method+" "+path] = true
		item := doc.Paths.Find(path)
		require.NotNil(t, item, "%s %s is served but not in openapi.yaml", r.Method, path)
		require.NotNil(t, item.GetOperation(r.Method), "%s %s is served but not in openapi.yaml", r.Method, path)
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			require.True(t, served[method+" "+path], "%s %s is in openapi.yaml but not served", method, path)
		}
	}
}

// dashboardRoute reports whether path belongs to the operators' dashboard
// or River UI rather than the public API. openapi.yaml documents the API
// that callers program against (/v1/*, health, readiness, metrics and the
// document itself); the dashboard's routes are the private back end of the
// pages embedded in the binary (and /ui/api mounts /v1 handlers that are
// documented already), so they are left out on purpose.
func dashboardRoute(path string) bool {
	switch {
	case path == "/", path == "/login", path == "/logout", path == "/riverui":
		return true
	case strings.HasPrefix(path, "/assets/"), strings.HasPrefix(path, "/ui/"), strings.HasPrefix(path, "/riverui/"):
		return true
	}
	return false
}

func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := b.call(t, request{method: http.MethodGet, path: "/openapi.yaml", noAuth: true})
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, openAPI, rec.Body.Bytes())
}

// publicScope is the x-herald-scope of a /v1 operation that takes no API
// key: a receipt's token is its credential.
const publicScope = "none"

// operationID is lowerCamel verb-noun: getMessage, listUserDevices.
var operationID = regexp.MustCompile(`^(get|list|create|put|update|register|delete|remove|add|cancel|revoke)[A-Z][A-Za-z]*$`)

// TestOpenAPIOperationsAreNamedAndDocumentTheirErrors holds openapi.yaml to
// what a generated client needs: every operation has a stable verb-noun
// operationId (the generated method's name) and documents its 4xx answers,
// and the document names its license. Each /v1 operation can be refused
// for its key (401) and its rate (429), names the scope its key needs
// (x-herald-scope) and, when that is more than read, can be refused for it
// (403); and each that takes a body or query parameters can be a 400.
func TestOpenAPIOperationsAreNamedAndDocumentTheirErrors(t *testing.T) {
	t.Parallel()
	doc, _ := openAPIRouter(t)
	require.NotNil(t, doc.Info.License, "info.license")
	require.Equal(t, "Apache-2.0", doc.Info.License.Name, "info.license.name")
	require.Equal(t, "https://www.apache.org/licenses/LICENSE-2.0", doc.Info.License.URL, "info.license.url")

	seen := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			require.Regexp(t, operationID, op.OperationID, "%s: operationId", where)
			require.NotContains(t, seen, op.OperationID, "%s: operationId %s is also %s's", where, op.OperationID, seen[op.OperationID])
			seen[op.OperationID] = where

			var clientErrors []string
			for status := range op.Responses.Map() {
				if strings.HasPrefix(status, "4") {
					clientErrors = append(clientErrors, status)
				}
			}
			require.NotEmpty(t, clientErrors, "%s documents no 4xx answer", where)
			if strings.HasPrefix(path, "/v1/") {
				require.Contains(t, clientErrors, "429", "%s: every /v1 call can be a 429", where)
				// Each names the scope its key needs; one that a read key
				// cannot make can be refused for its scope.
				scope, _ := op.Extensions["x-herald-scope"].(string)
				if scope == publicScope {
					// It takes no key (what a device calls), so it says so:
					// it needs nothing, or a credential of a device's own.
					require.NotNil(t, op.Security, "%s takes no key: security: [] or a device's credential", where)
					for _, req := range *op.Security {
						require.NotContains(t, req, "apiKey", "%s takes no key", where)
					}
					continue
				}
				require.Contains(t, clientErrors, "401", "%s: every /v1 call with a key can be a 401", where)
				need, err := ParseScope(scope)
				require.NoError(t, err, "%s: x-herald-scope", where)
				if need != ScopeRead {
					require.Contains(t, clientErrors, "403", "%s needs scope %s, so it can be a 403", where, need)
				}
			}
			takesInput := op.RequestBody != nil
			for _, p := range append(item.Parameters, op.Parameters...) {
				takesInput = takesInput || p.Value.In == openapi3.ParameterInQuery
			}
			if takesInput {
				require.Contains(t, clientErrors, "400", "%s takes input, so it can be a 400", where)
			}
		}
	}
}
