"""A real OAuth 2.1 authorization server for toolguard's tests, built with
authlib (Flask): the client-credentials grant, JWT access tokens (RFC 9068)
whose `aud` is the RFC 8707 `resource` the client asked for, RFC 8414
metadata and a JWKS. Test controls under /control: mint a token with
chosen claims (to be expired, for another audience, signed by a key the
JWKS does not publish…), rotate the signing key, go down, count JWKS fetches.

Usage: authorization_server.py PORT CLIENTS_JSON [TOKEN_SECONDS [CERT KEY]]
CLIENTS_JSON: [[client_id, secret, "allowed scopes"], ...]. With CERT and
KEY (PEM) it serves HTTPS. Prints "listening" once it serves.
"""

import json
import sys
import time

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from flask import Flask, jsonify, request
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

port = int(sys.argv[1])
lifetime = int(sys.argv[3]) if len(sys.argv) > 3 else 300
tls = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else None
issuer = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
app = Flask(__name__)


def new_key(n):
    return RSAKey.generate_key(2048, parameters={"kid": f"key-{n}", "use": "sig", "alg": "RS256"}, private=True)


state = {"keys": [new_key(1)], "unpublished": new_key(0), "down": False, "jwks_fetches": 0, "tokens": []}


class Client(ClientMixin):
    def __init__(self, client_id, secret, scope):
        self.client_id, self.secret, self.scope = client_id, secret, scope

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None

    def get_allowed_scope(self, scope):
        allowed = self.scope.split()
        return " ".join(s for s in (scope or "").split() if s in allowed)

    def check_redirect_uri(self, uri):
        return False

    def check_client_secret(self, secret):
        return secret == self.secret

    def check_endpoint_auth_method(self, method, endpoint):
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type):
        return False

    def check_grant_type(self, grant_type):
        return grant_type == "client_credentials"


CLIENTS = {c.client_id: c for c in (Client(*entry) for entry in json.loads(sys.argv[2]))}


class Tokens(JWTBearerTokenGenerator):
    def get_jwks(self):
        return KeySet([state["keys"][-1]]).as_dict(private=True)

    def get_audiences(self, client, user, scope):
        # RFC 8707: the token is for the resource the client named.
        return request.form.get("resource") or client.get_client_id()


server = AuthorizationServer(app, query_client=CLIENTS.get, save_token=lambda token, req: None)
server.register_grant(grants.ClientCredentialsGrant)
server.register_token_generator("default", Tokens(issuer=issuer, expires_generator=lambda client, grant_type: lifetime))


def unavailable():
    return ("the authorization server is down\n", 503)


@app.post("/token")
def token():
    if state["down"]:
        return unavailable()
    state["tokens"].append(request.form.get("scope", ""))
    return server.create_token_response()


@app.get("/authorize")
def authorize():
    # Required in the metadata (RFC 8414); no browser flow is offered here.
    return ("only the client-credentials grant is offered\n", 400)


@app.get("/.well-known/oauth-authorization-server")
def metadata():
    if state["down"]:
        return unavailable()
    return jsonify(
        issuer=issuer,
        authorization_endpoint=f"{issuer}/authorize",
        token_endpoint=f"{issuer}/token",
        jwks_uri=f"{issuer}/jwks",
        grant_types_supported=["client_credentials"],
        token_endpoint_auth_methods_supported=["client_secret_basic", "client_secret_post"],
        response_types_supported=["token"],
        scopes_supported=sorted({s for c in CLIENTS.values() for s in c.scope.split()}),
    )


@app.get("/jwks")
def jwks():
    state["jwks_fetches"] += 1
    if state["down"]:
        return unavailable()
    return jsonify(KeySet(state["keys"]).as_dict(private=False))


@app.post("/control/mint")
def mint():
    """A token with the given claims over these defaults, signed by the current key (or `key`)."""
    body = request.get_json()
    now = int(time.time())
    claims = {"iss": issuer, "sub": "minted", "aud": body.get("aud"), "iat": now, "exp": now + 300, "scope": ""}
    claims.update(body.get("claims", {}))
    claims = {k: v for k, v in claims.items() if v is not None}
    key = state["unpublished"] if body.get("key") == "unpublished" else state["keys"][-1]
    header = {"alg": "RS256", "kid": key.kid, "typ": "at+jwt"}
    return jwt.encode(header, claims, key)


@app.post("/control/rotate")
def rotate():
    state["keys"].append(new_key(len(state["keys"]) + 1))
    return state["keys"][-1].kid


@app.post("/control/down")
def down():
    state["down"] = True
    return "down"


@app.get("/control/token-requests")
def token_requests():
    """The scope each token request asked for, in order."""
    return jsonify(state["tokens"])


@app.get("/control/jwks-fetches")
def jwks_fetches():
    return str(state["jwks_fetches"])


print("listening", flush=True)
app.run(host="127.0.0.1", port=port, ssl_context=tls)
