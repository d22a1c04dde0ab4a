package stripetest

import (
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Account is a Connect account: one given to New (onboarded), or an
// Express account the fake created from a POST /v1/accounts.
type Account struct {
	ID          string
	Form        url.Values // the create request's form; nil for New's
	Idempotency string     // its Idempotency-Key header
	Type        string     // "express" for a created one; "" for New's
	Country     string
	TenantID    string // metadata[tenant_id]
	// Transfers is the transfers and card_payments capability: "active",
	// "inactive" or "pending"; TransfersActive reads it.
	Transfers string
	// The flags billing.AccountState reads.
	ChargesEnabled, PayoutsEnabled, DetailsSubmitted bool
}

// onboardPath is where the fake's account links point: the page Stripe's
// hosted onboarding would be.
const onboardPath = "/connect/onboard/"

// linkLifetime is how long an account link lives, as Stripe's do (a few
// minutes).
const linkLifetime = 5 * time.Minute

// Accounts returns copies of the accounts created with POST /v1/accounts,
// oldest first (not New's).
func (s *Server) Accounts() []Account {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Account, 0, len(s.accountOrder))
	for _, id := range s.accountOrder {
		out = append(out, *s.accounts[id])
	}
	return out
}

// Account returns a copy of account id and whether it exists.
func (s *Server) Account(id string) (Account, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.accounts[id]
	if !ok {
		return Account{}, false
	}
	return *a, true
}

// EnableAccount marks account id's charges and payouts enabled as given;
// enabling both also submits the details and activates its capabilities,
// as finishing Stripe's onboarding (the page's button) does.
func (s *Server) EnableAccount(id string, charges, payouts bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.accounts[id]
	if !ok {
		return fmt.Errorf("stripetest: no account %s", id)
	}
	a.ChargesEnabled, a.PayoutsEnabled = charges, payouts
	if charges && payouts {
		a.DetailsSubmitted, a.Transfers = true, "active"
	}
	return nil
}

// AccountUpdatedEvent returns an account.updated event about account id
// as it is now, signed as Event signs.
func (s *Server) AccountUpdatedEvent(eventID, accountID, secret string, signedAt time.Time) (payload []byte, signature string, err error) {
	s.mu.Lock()
	a, ok := s.accounts[accountID]
	var obj map[string]any
	if ok {
		obj = accountJSON(a)
	}
	s.mu.Unlock()
	if !ok {
		return nil, "", fmt.Errorf("stripetest: no account %s", accountID)
	}
	return signedEvent(eventID, "account.updated", obj, secret, signedAt)
}

func (s *Server) account(w http.ResponseWriter, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.accounts[id]
	if !ok {
		stripeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "No such account: '"+id+"'")
		return
	}
	writeJSON(w, accountJSON(a))
}

func (s *Server) createAccount(w http.ResponseWriter, r *http.Request) {
	f := r.PostForm
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.accounts[s.accountByKey[key]]; ok && key != "" {
		if !sameForm(a.Form, f) {
			idempotencyError(w, key)
			return
		}
		writeJSON(w, accountJSON(a)) // a retry: the same account
		return
	}
	if f.Get("type") != "express" {
		stripeParamError(w, http.StatusBadRequest, "invalid_request_error", "", "type",
			"stripetest makes Express accounts only, not type '"+f.Get("type")+"'")
		return
	}
	// Alphanumeric after acct_, as Stripe's ids (and billing's check) are.
	a := &Account{ID: fmt.Sprintf("acct_1Stripetest%06d", len(s.accountOrder)+1), Form: f, Idempotency: key,
		Type: "express", Country: f.Get("country"), TenantID: f.Get("metadata[tenant_id]"), Transfers: "inactive"}
	s.accounts[a.ID] = a
	s.accountOrder = append(s.accountOrder, a.ID)
	if key != "" {
		s.accountByKey[key] = a.ID
	}
	writeJSON(w, accountJSON(a))
}

func (s *Server) createAccountLink(w http.ResponseWriter, r *http.Request) {
	f := r.PostForm
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range []string{"account", "type", "refresh_url", "return_url"} {
		if f.Get(p) == "" {
			stripeParamError(w, http.StatusBadRequest, "invalid_request_error", "parameter_missing", p, "Missing required param: "+p+".")
			return
		}
	}
	if f.Get("type") != "account_onboarding" {
		stripeParamError(w, http.StatusBadRequest, "invalid_request_error", "", "type",
			"stripetest makes account_onboarding links only, not '"+f.Get("type")+"'")
		return
	}
	id := f.Get("account")
	if _, ok := s.accounts[id]; !ok {
		stripeParamError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "account", "No such account: '"+id+"'")
		return
	}
	now := time.Now()
	q := url.Values{"return": {f.Get("return_url")}, "refresh": {f.Get("refresh_url")}}
	writeJSON(w, map[string]any{"object": "account_link", "created": now.Unix(),
		"expires_at": now.Add(linkLifetime).Unix(), "url": s.URL + onboardPath + id + "?" + q.Encode()})
}

// onboardPage is the fake's stand-in for Stripe's hosted onboarding: a
// browser test finishes it (the form: the account is enabled, then back
// to the return URL), leaves it unfinished (back to the return URL as
// is), or follows the refresh URL as for an expired link.
var onboardPage = template.Must(template.New("onboard").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Stripe onboarding (stripetest)</title></head>
<body>
<h1>Onboarding of {{.Account}}</h1>
<form method="post" action="{{.Action}}">
<input type="hidden" name="return" value="{{.Return}}">
<button type="submit" id="finish">Finish onboarding</button>
</form>
<p><a id="leave" href="{{.Return}}">Return without finishing</a></p>
<p><a id="refresh" href="{{.Refresh}}">The link expired</a></p>
</body></html>
`))

// onboard serves the page of an account link (GET) and its button (POST).
// It is the browser's, so it needs no key and Down does not stop it.
func (s *Server) onboard(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, onboardPath)
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	back, refresh := r.Form.Get("return"), r.Form.Get("refresh")
	if _, ok := s.Account(id); !ok || !httpURL(back) || (r.Method == http.MethodGet && !httpURL(refresh)) {
		http.Error(w, "stripetest: no such account link", http.StatusNotFound)
		return
	}
	switch r.Method {
	case http.MethodGet:
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = onboardPage.Execute(w, map[string]string{"Account": id, "Action": onboardPath + id, "Return": back, "Refresh": refresh})
	case http.MethodPost:
		_ = s.EnableAccount(id, true, true)
		http.Redirect(w, r, back, http.StatusSeeOther)
	default:
		http.Error(w, "stripetest: GET or POST", http.StatusMethodNotAllowed)
	}
}

// httpURL reports whether s is an absolute http(s) URL, so that the page
// sends the browser nowhere else.
func httpURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// accountJSON renders a as Stripe's Account object.
func accountJSON(a *Account) map[string]any {
	country := a.Country
	if country == "" {
		country = "DE"
	}
	obj := map[string]any{"id": a.ID, "object": "account", "country": country,
		"charges_enabled": a.ChargesEnabled, "payouts_enabled": a.PayoutsEnabled, "details_submitted": a.DetailsSubmitted,
		"capabilities": map[string]string{"card_payments": a.Transfers, "transfers": a.Transfers},
		"metadata":     map[string]string{}}
	if a.Type != "" {
		obj["type"] = a.Type
	}
	if a.TenantID != "" {
		obj["metadata"] = map[string]string{"tenant_id": a.TenantID}
	}
	return obj
}
