package fake

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
)

// jws is a compact-serialized JSON Web Signature (a JWT) split into its parts.
// fakepush verifies three kinds of them (APNs provider tokens, Google JWT-bearer
// assertions and VAPID tokens) and needs only ES256 and RS256, so a few lines here
// replace a general JWT library and keep verification cheap and explicit.
type jws struct {
	header jwsHeader
	claims []byte // the decoded payload, JSON
	signed string // "header.payload", the signing input
	sig    []byte
}

type jwsHeader struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
}

// jwtClaims holds the registered claims the three token kinds use. Times are
// float64 because JSON numbers may legally carry a fraction or an exponent.
type jwtClaims struct {
	Iss   string  `json:"iss"`
	Sub   string  `json:"sub"`
	Aud   string  `json:"aud"`
	Scope string  `json:"scope"`
	Iat   float64 `json:"iat"`
	Exp   float64 `json:"exp"`
}

var errMalformedJWT = errors.New("malformed JWT")

func parseJWS(token string) (jws, error) {
	h, rest, ok := strings.Cut(token, ".")
	if !ok {
		return jws{}, errMalformedJWT
	}
	p, s, ok := strings.Cut(rest, ".")
	if !ok || strings.IndexByte(s, '.') >= 0 {
		return jws{}, errMalformedJWT
	}
	enc := base64.RawURLEncoding
	hdr, err := enc.DecodeString(h)
	if err != nil {
		return jws{}, errMalformedJWT
	}
	var j jws
	if err := json.Unmarshal(hdr, &j.header); err != nil {
		return jws{}, errMalformedJWT
	}
	if j.claims, err = enc.DecodeString(p); err != nil {
		return jws{}, errMalformedJWT
	}
	if j.sig, err = enc.DecodeString(s); err != nil {
		return jws{}, errMalformedJWT
	}
	j.signed = token[:len(h)+1+len(p)]
	return j, nil
}

// decodeClaims unmarshals the payload into the registered claims.
func (j jws) decodeClaims() (jwtClaims, error) {
	var c jwtClaims
	if err := json.Unmarshal(j.claims, &c); err != nil {
		return jwtClaims{}, errMalformedJWT
	}
	return c, nil
}

// verifyES256 checks a JOSE ECDSA signature, which is r||s (32 bytes each) rather
// than the ASN.1 form crypto/ecdsa signs by default.
func (j jws) verifyES256(pub *ecdsa.PublicKey) bool {
	if j.header.Alg != "ES256" || len(j.sig) != 64 {
		return false
	}
	sum := sha256.Sum256([]byte(j.signed))
	r := new(big.Int).SetBytes(j.sig[:32])
	s := new(big.Int).SetBytes(j.sig[32:])
	return ecdsa.Verify(pub, sum[:], r, s)
}

func (j jws) verifyRS256(pub *rsa.PublicKey) bool {
	if j.header.Alg != "RS256" {
		return false
	}
	sum := sha256.Sum256([]byte(j.signed))
	return rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], j.sig) == nil
}
