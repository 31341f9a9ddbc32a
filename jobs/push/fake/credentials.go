package fake

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Environment variable names written to DIR/env, fixed by the product contract.
const (
	EnvAPNsKeyFile        = "APNS_KEY_FILE"
	EnvAPNsKeyID          = "APNS_KEY_ID"
	EnvAPNsTeamID         = "APNS_TEAM_ID"
	EnvAPNsTopic          = "APNS_TOPIC"
	EnvAPNsHost           = "APNS_HOST"
	EnvAPNsSandboxHost    = "APNS_SANDBOX_HOST"
	EnvFCMCredentialsFile = "FCM_CREDENTIALS_FILE"
	EnvFCMEndpoint        = "FCM_ENDPOINT"
	EnvVAPIDPublicKey     = "VAPID_PUBLIC_KEY"
	EnvVAPIDPrivateKey    = "VAPID_PRIVATE_KEY"
	EnvVAPIDSubject       = "VAPID_SUBJECT"
	EnvSSLCertFile        = "SSL_CERT_FILE"
	EnvWebPushHosts       = "HERALD_WEBPUSH_HOSTS"
)

// credentials are the provider-side secrets of one fakepush directory: what
// Apple, Google and a browser vendor would hold, plus the matching client halves
// that fakepush writes out for Herald.
type credentials struct {
	apnsKey    *ecdsa.PrivateKey
	apnsKeyID  string
	apnsTeamID string

	fcmKey   *rsa.PrivateKey
	fcmKeyID string

	vapidKey     *ecdsa.PrivateKey
	vapidPublic  []byte // uncompressed P-256 point, as VAPID's k= carries it
	vapidPrivate []byte // the 32-byte scalar, as webpush-go expects it

	// secret keys the HMACs behind stateless FCM access tokens and Web Push
	// subscription ids, so both survive a restart without any stored state.
	secret []byte
}

// loadOrCreateCredentials reuses every key already in dir and generates the rest.
func loadOrCreateCredentials(dir string) (*credentials, error) {
	var c credentials
	var err error

	if c.apnsKey, err = loadOrCreateECKey(filepath.Join(dir, fileAPNsKey)); err != nil {
		return nil, err
	}
	if c.apnsKeyID, c.apnsTeamID, err = appleIDs(c.apnsKey); err != nil {
		return nil, err
	}

	if c.fcmKey, c.fcmKeyID, err = loadOrCreateServiceAccountKey(filepath.Join(dir, fileFCMAccount)); err != nil {
		return nil, err
	}

	if c.vapidKey, err = loadOrCreateECKey(filepath.Join(dir, fileVAPIDKey)); err != nil {
		return nil, err
	}
	if c.vapidPublic, err = c.vapidKey.PublicKey.Bytes(); err != nil {
		return nil, fmt.Errorf("encode VAPID public key: %w", err)
	}
	if c.vapidPrivate, err = c.vapidKey.Bytes(); err != nil {
		return nil, fmt.Errorf("encode VAPID private key: %w", err)
	}

	if c.secret, err = loadOrCreateSecret(filepath.Join(dir, fileSecret)); err != nil {
		return nil, err
	}
	return &c, nil
}

func loadOrCreateECKey(path string) (*ecdsa.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		key, err := parseECKeyPEM(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return key, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key for %s: %w", path, err)
	}
	if err := writeKeyFile(path, key); err != nil {
		return nil, err
	}
	return key, nil
}

// appleIDs derives an APNs key's id and a team id from the key. Apple's key and
// team ids are ten upper-case alphanumerics; deriving them from the key keeps
// them stable without storing them anywhere.
func appleIDs(key *ecdsa.PrivateKey) (keyID, teamID string, err error) {
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("encode APNs public key: %w", err)
	}
	sum := sha256.Sum256(pub)
	ids := base32.StdEncoding.EncodeToString(sum[:])
	return ids[:10], ids[10:20], nil
}

// keyPEM encodes a private key as PKCS#8 "PRIVATE KEY" PEM, the exact format
// of an Apple .p8 download and of a Google service account's private_key.
func keyPEM(key any) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// writeKeyFile writes key to path as keyPEM encodes it, readable by its owner
// only.
func writeKeyFile(path string, key any) error {
	data, err := keyPEM(key)
	if err != nil {
		return fmt.Errorf("encode key for %s: %w", path, err)
	}
	return writeFileAtomic(path, data, 0o600)
}

// serviceAccount is the JSON shape Google hands out for a service-account key.
// The token_uri is what makes client libraries exchange their JWT with fakepush.
type serviceAccount struct {
	Type           string `json:"type"`
	ProjectID      string `json:"project_id"`
	PrivateKeyID   string `json:"private_key_id"`
	PrivateKey     string `json:"private_key"`
	ClientEmail    string `json:"client_email"`
	ClientID       string `json:"client_id"`
	AuthURI        string `json:"auth_uri"`
	TokenURI       string `json:"token_uri"`
	UniverseDomain string `json:"universe_domain"`
}

// loadOrCreateServiceAccountKey returns the RSA key of an existing service-account
// file, or a new one. The file itself is rewritten on every start by
// writeServiceAccount, because its token_uri follows the listen address.
func loadOrCreateServiceAccountKey(path string) (*rsa.PrivateKey, string, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		var sa serviceAccount
		if err := json.Unmarshal(data, &sa); err != nil {
			return nil, "", fmt.Errorf("%s: %w", path, err)
		}
		block, _ := pem.Decode([]byte(sa.PrivateKey))
		if block == nil {
			return nil, "", fmt.Errorf("%s: private_key is not PEM", path)
		}
		key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, "", fmt.Errorf("%s: private_key: %w", path, err)
		}
		rsaKey, ok := key.(*rsa.PrivateKey)
		if !ok {
			return nil, "", fmt.Errorf("%s: private_key is not RSA", path)
		}
		return rsaKey, sa.PrivateKeyID, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("read %s: %w", path, err)
	}
	return newServiceAccountKey()
}

// newServiceAccountKey makes a service-account key as Google does: RSA 2048
// and a private_key_id of 40 hex digits.
func newServiceAccountKey() (*rsa.PrivateKey, string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, "", fmt.Errorf("generate service-account key: %w", err)
	}
	id := make([]byte, 20)
	if _, err := rand.Read(id); err != nil {
		return nil, "", fmt.Errorf("generate service-account key id: %w", err)
	}
	return key, hex.EncodeToString(id), nil
}

func loadOrCreateSecret(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		secret, err := hex.DecodeString(strings.TrimSpace(string(data)))
		if err != nil || len(secret) < 32 {
			return nil, fmt.Errorf("%s: want at least 32 hex-encoded bytes", path)
		}
		return secret, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("generate secret: %w", err)
	}
	if err := writeFileAtomic(path, []byte(hex.EncodeToString(secret)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return secret, nil
}

// clientEmail is the service account's identity, checked as the JWT issuer.
func (c *credentials) clientEmail(project string) string { return clientEmail(project) }

// clientEmail is the email of the service account fakepush makes for a
// project: one per project, so it names the project's app.
func clientEmail(project string) string {
	return "firebase-adminsdk-fake@" + project + ".iam.gserviceaccount.com"
}

// writeServiceAccount writes the service-account JSON whose token_uri points at
// this server's /token.
func (c *credentials) writeServiceAccount(path, project, tokenURI string) error {
	data, err := encodeServiceAccount(c.fcmKey, c.fcmKeyID, project, tokenURI)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data, 0o600)
}

// encodeServiceAccount renders the service-account file of key for project,
// its token_uri pointing at tokenURI, as Google's console hands it out.
func encodeServiceAccount(key *rsa.PrivateKey, keyID, project, tokenURI string) ([]byte, error) {
	private, err := keyPEM(key)
	if err != nil {
		return nil, fmt.Errorf("encode service-account key: %w", err)
	}
	sa := serviceAccount{
		Type:           "service_account",
		ProjectID:      project,
		PrivateKeyID:   keyID,
		PrivateKey:     string(private),
		ClientEmail:    clientEmail(project),
		ClientID:       "100000000000000000000",
		AuthURI:        "https://accounts.google.com/o/oauth2/auth",
		TokenURI:       tokenURI,
		UniverseDomain: "googleapis.com",
	}
	data, err := json.MarshalIndent(sa, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode service account: %w", err)
	}
	return append(data, '\n'), nil
}

// encodeEnvFile renders env as KEY=value lines a shell can source. The closing
// export line matters: plain assignments in a sourced file stay shell variables,
// and a Herald started from that shell would not see them. Parsers of KEY=value
// files skip it because it has no '='.
func encodeEnvFile(env map[string]string) []byte {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteString("# Written by herald fakepush. Use it with: . DIR/env (or set -a; . DIR/env; set +a).\n")
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(shellQuote(env[k]))
		b.WriteByte('\n')
	}
	b.WriteString("export")
	for _, k := range keys {
		b.WriteByte(' ')
		b.WriteString(k)
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// shellQuote leaves plain values alone, so that the file also reads well as a
// dotenv file, and single-quotes anything a shell would split or expand.
func shellQuote(v string) string {
	plain := v != ""
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@+=,", r)) {
			plain = false
			break
		}
	}
	if plain {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// ParseEnvFile reads the KEY=value lines of a file written by fakepush (or any
// dotenv-style file), skipping comments and lines without '=' and undoing the
// single quotes fakepush adds. It is what Go callers use instead of a shell.
func ParseEnvFile(data []byte) map[string]string {
	env := make(map[string]string)
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.ContainsAny(k, " \t") {
			continue
		}
		if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = strings.ReplaceAll(v[1:len(v)-1], `'\''`, "'")
		}
		env[k] = v
	}
	return env
}
