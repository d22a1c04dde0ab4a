package market

import (
	"errors"
	"net/http"
	"strings"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

var errUnauthorized = apierr.New(reason.Unauthorized)

// errNotSharing is the answer to every action of a tenant that does not
// share its disk (docs/api.md: 409 notSharing).
var errNotSharing = apierr.New(reason.NotSharing)

// tenantRoute authenticates the request before h runs, so that nothing of a
// tenant route (not even body parsing) is reachable without a token.
func (s *Server) tenantRoute(h func(http.ResponseWriter, *http.Request, imagestore.Tenant)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t, err := s.authenticate(r)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		h(w, r, t)
	}
}

// authenticate finds the tenant of the bearer token. The token is only ever
// hashed and looked up: the store's equality on the hash is the comparison,
// so there is no hand-written compare to leak timing, and the token is never
// logged or kept.
func (s *Server) authenticate(r *http.Request) (imagestore.Tenant, error) {
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return imagestore.Tenant{}, errUnauthorized
	}
	t, err := s.st.TenantByToken(r.Context(), imagestore.HashSecret(token))
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return imagestore.Tenant{}, errUnauthorized
	case err != nil:
		return imagestore.Tenant{}, err // a store fault: 500, cause logged
	}
	return t, nil
}

// bearerToken extracts the token of an "Authorization: Bearer <token>"
// header. The scheme is case-insensitive (RFC 9110 §11.1).
func bearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
