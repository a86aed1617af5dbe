// The OpenID Connect provider of sked's login tests: oidc-provider (a certified
// implementation) with its development login form, which takes any account name.
//
// node provider.mjs PORT CLIENT_ID CLIENT_SECRET REDIRECT_URI
//
// Accounts: `alice` is in the `sked-operators` group, `vera` in `sked-viewers`, and anyone
// else (say `mallory`) only in `marketing`. Groups go in the ID token as `groups`. It prints
// `ready` once it listens.
import Provider from 'oidc-provider';

const [port, clientId, clientSecret, redirectUri] = process.argv.slice(2);
const groups = {
  alice: ['sked-operators', 'everyone'],
  vera: ['sked-viewers', 'everyone'],
};

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  pkce: { required: () => true },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email'],
    groups: ['groups'],
  },
  // Claims in the ID token itself, as most providers put a groups claim there.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true } },
  cookies: { keys: ['sked-test-provider-cookies'] },
  async findAccount(ctx, id) {
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          name: id,
          preferred_username: id,
          email: `${id}@example.test`,
          groups: groups[id] ?? ['marketing'],
        };
      },
    };
  },
});
provider.proxy = false;
provider.listen(Number(port), '127.0.0.1', () => console.log('ready'));
