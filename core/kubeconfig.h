/* Cluster configuration the way kubectl finds it: --kubeconfig, $KUBECONFIG
** (a colon-separated list, first value wins), ~/.kube/config when it
** exists, the in-cluster service account. Parsed with libyaml. Secrets (token, client key) stay in
** this C memory and are wiped when freed. */
#ifndef COZY_KUBECONFIG_H
#define COZY_KUBECONFIG_H

#include <stddef.h>

#include <yaml.h>

struct cozy_exec;

/* Environment variable overriding the service account directory (tests). */
#define COZY_SA_DIR_ENV "COZY_MIGRATE_SERVICEACCOUNT_DIR"
#define COZY_SA_DIR_DEFAULT "/var/run/secrets/kubernetes.io/serviceaccount"

/* Limits on what configuration may cost to read. Each is far above any
** real file and low enough that a path to /dev/zero or a generated file
** fails at once, with an error naming the limit:
** - a kubeconfig: real ones are KiBs (embedded certificates included);
** - a YAML nesting depth: a kubeconfig nests 5 levels (users[].user.exec.env[]);
** - a bearer token: service account JWTs are about 1 KiB, OIDC ones a few;
** - a PEM file (CA bundle, client certificate or key): the whole Debian
**   trust store is some 200 KiB. */
#define COZY_MAX_KUBECONFIG_BYTES (16u * 1024 * 1024)
#define COZY_MAX_YAML_DEPTH 64
#define COZY_MAX_TOKEN_BYTES (64u * 1024)
#define COZY_MAX_PEM_BYTES (4u * 1024 * 1024)

struct cozy_config_error {
  char file[512]; /* the file at fault (or the environment variable) */
  char field[256]; /* e.g. users[admin].user.client-key-data; "" if none */
  char message[512]; /* never contains a secret value */
};

struct cozy_blob {
  char *data;
  size_t len;
};

struct cozy_kubeconfig {
  char *source; /* kubeconfig path(s) or "in-cluster" */
  char *context; /* context name used (NULL in-cluster) */
  char *cluster, *user; /* names, for messages */
  char *server; /* scheme://host[:port][/prefix], no trailing slash */
  char *namespace; /* from the context or the service account; may be NULL */
  struct cozy_blob ca; /* PEM; empty means the system trust store */
  struct cozy_blob cert; /* client certificate, PEM */
  struct cozy_blob key; /* client key, PEM: secret */
  struct cozy_blob token; /* bearer token: secret */
  char *token_file; /* re-read periodically and after a 401 */
  struct cozy_exec *exec; /* users[].user.exec: run again on expiry and after a 401 */
  char *tls_server_name, *proxy_url; /* the cluster's; may be NULL */
  int insecure; /* insecure-skip-tls-verify: true in the kubeconfig */
  /* The user's impersonation, sent on every request as client-go sends it
  ** (Impersonate-User, -Uid, one Impersonate-Group per group, one
  ** Impersonate-Extra-<key> per value). as_user NULL: none (then the others
  ** are NULL too: client-go refuses them without a user). */
  char *as_user, *as_uid; /* as, as-uid */
  char **as_groups; /* as-groups, NULL-terminated */
  char **as_extra; /* as-user-extra: key, value, key, value, ... NULL; a key once per value, in order */
};

/* Loads the configuration; returns 0, or -1 with err filled. path and
** context may be NULL. On failure kc holds nothing to free. An exec plugin
** is read, not run: kc->exec says how (cozy_exec_run, exec_credential.h). */
int cozy_kubeconfig_load(const char *path, const char *context, struct cozy_kubeconfig *kc,
                         struct cozy_config_error *err);
void cozy_kubeconfig_free(struct cozy_kubeconfig *kc);

/* The value of `key` in YAML mapping `map` of `doc`, or NULL. */
yaml_node_t *cozy_yaml_get(yaml_document_t *doc, yaml_node_t *map, const char *key);

/* Reads a whole file of at most max bytes; returns 0, or -1 with errno set
** (EFBIG: the file has more than max bytes; reading stopped there). */
int cozy_read_file(const char *path, size_t max, struct cozy_blob *out);
/* 1 if the token has a byte that cannot go into an HTTP header value: CR,
** LF, NUL or another control character (it would end the Authorization
** header and start another). */
int cozy_token_invalid(const struct cozy_blob *token);
/* Drops trailing whitespace (token files end with a newline). */
void cozy_blob_rtrim(struct cozy_blob *b);
/* Wipes and frees. */
void cozy_blob_free(struct cozy_blob *b);

#endif
