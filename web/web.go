// Package web holds Herald's dashboard: plain HTML, CSS and JavaScript with
// no build step, embedded in the binary and served by package api. The
// pages read their data from the session-authenticated /ui/api routes, so
// no API key ever reaches the browser. Beside it are the web kit a site's
// pages use for Web Push (SDK) and the form a user sets their own
// preferences in (PreferencesForm).
package web

import (
	"embed"
	"io/fs"
)

// files is read-only: an embed.FS cannot be changed after compilation.
//
//go:embed index.html login.html assets
var files embed.FS

// FS returns the dashboard's files: index.html (the single-page app),
// login.html (an html/template) and assets/ (scripts and styles).
func FS() fs.FS { return files }

// sdk is the web kit a site's pages use for Web Push.
//
//go:embed sdk
var sdk embed.FS

// SDK returns the web kit's files, under sdk/: herald-sw.js (the service
// worker), herald.js (the page script) and example.html and example.js (a
// page that uses them). Package api serves them at /sdk/.
func SDK() fs.FS { return sdk }

// preferencesForm is the form a user sets their own preferences in, opened
// from a link the caller's backend asks Herald for.
//
//go:embed preferences
var preferencesForm embed.FS

// PreferencesForm returns the form's files, under preferences/: index.html
// (the page), form.js and form.css. Package api serves the page at
// /preferences and the others under /preferences/.
func PreferencesForm() fs.FS { return preferencesForm }
