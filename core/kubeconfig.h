/* Cluster configuration the way kubectl finds it: --kubeconfig, $KUBECONFIG
** (a colon-separated list, first value wins), in-cluster service account,
** ~/.kube/config. Parsed with libyaml. Secrets (token, client key) stay in
** this C memory and are wiped when freed. */
#ifndef COZY_KUBECONFIG_H
#define COZY_KUBECONFIG_H

#include <stddef.h>

/* Environment variable overriding the service account directory (tests). */
#define COZY_SA_DIR_ENV "COZY_MIGRATE_SERVICEACCOUNT_DIR"
#define COZY_SA_DIR_DEFAULT "/var/run/secrets/kubernetes.io/serviceaccount"

struct cozy_config_error {
  char file[512];    /* the file at fault (or the environment variable) */
  char field[256];   /* e.g. users[admin].user.client-key-data; "" if none */
  char message[512]; /* never contains a secret value */
};

struct cozy_blob {
  char *data;
  size_t len;
};

struct cozy_kubeconfig {
  char *source;          /* kubeconfig path(s) or "in-cluster" */
  char *context;         /* context name used (NULL in-cluster) */
  char *cluster, *user;  /* names, for messages */
  char *server;          /* scheme://host[:port][/prefix], no trailing slash */
  char *namespace;       /* from the context or the service account; may be NULL */
  struct cozy_blob ca;   /* PEM; empty means the system trust store */
  struct cozy_blob cert; /* client certificate, PEM */
  struct cozy_blob key;  /* client key, PEM: secret */
  struct cozy_blob token;/* bearer token: secret */
  char *token_file;      /* re-read periodically and after a 401 */
  int insecure;          /* insecure-skip-tls-verify: true in the kubeconfig */
};

/* Loads the configuration; returns 0, or -1 with err filled. path and
** context may be NULL. On failure kc holds nothing to free. */
int cozy_kubeconfig_load(const char *path, const char *context,
                         struct cozy_kubeconfig *kc, struct cozy_config_error *err);
void cozy_kubeconfig_free(struct cozy_kubeconfig *kc);

/* Reads a whole file; returns 0 or -1 with errno set. */
int cozy_read_file(const char *path, struct cozy_blob *out);
/* Drops trailing whitespace (token files end with a newline). */
void cozy_blob_rtrim(struct cozy_blob *b);
/* Wipes and frees. */
void cozy_blob_free(struct cozy_blob *b);

#endif
