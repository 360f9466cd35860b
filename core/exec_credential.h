/* Exec credential plugins (client.authentication.k8s.io/v1 and v1beta1), as
** client-go runs them: the kubeconfig's users[].user.exec names a command
** (aws eks get-token, gke-gcloud-auth-plugin, kubelogin...) whose stdout is
** an ExecCredential carrying a token or a client certificate, and maybe an
** expirationTimestamp. kubeconfig.c reads the stanza into a cozy_exec; the
** transport runs it at connect, again once the credential has expired, and
** after a 401. The plugin runs in its own process group with fds 0-2 only,
** bounded in time and in output; its stderr is the operator's; its stdout
** (a secret) is never echoed in a message. */
#ifndef COZY_EXEC_CREDENTIAL_H
#define COZY_EXEC_CREDENTIAL_H

#include <stddef.h>

struct cozy_kubeconfig;
struct cozy_blob;
struct cozy_watches;

/* What a plugin may print: a token, a certificate chain and its key are a
** few KiB; 1 MiB stops a plugin that prints without end at once. */
#define COZY_MAX_EXEC_OUTPUT (1024u * 1024)
/* How long a plugin may run (seconds), unless transport.new says exec_timeout. */
#define COZY_EXEC_TIMEOUT_DEFAULT 60.0

/* A command as client-go's exec.LookPath finds it: a name without a slash in
** $PATH (unset or empty: /usr/local/bin:/usr/bin:/bin), else the path as
** given. Returns a malloc'd path, or NULL with errno ENOENT (not found) or
** EPERM (found first through an empty or relative PATH element, never run:
** dot holds that path). */
char *cozy_find_command(const char *command, char *dot, size_t dotlen);

enum cozy_exec_interactive { COZY_EXEC_NEVER, COZY_EXEC_IF_AVAILABLE, COZY_EXEC_ALWAYS };

struct cozy_exec {
  char *file; /* the kubeconfig that declared it, and the field, for messages */
  char *field;
  char *command; /* as written (messages); path: the one executed */
  char *path;
  char **argv; /* argv[0] = command, NULL-terminated */
  char **env; /* "NAME=VALUE" added to ours, NULL-terminated */
  char *api_version;
  char *install_hint; /* may be NULL */
  int interactive_mode;
  int provide_cluster_info;
  double timeout; /* seconds */
  double expires_at; /* wall clock (time(2) seconds) of the credential; 0: none */
};

/* Runs the plugin and puts what it returned into kc (token, or client
** certificate and key, replacing what kc held) and ex->expires_at. Unless
** `renew` (after a 401), a credential this process already has from the
** same plugin, run the same way, and that has not expired is taken instead
** (client-go's cache). Returns 0, or -1 with a one-line message in err (no
** secret in it); kc keeps its old credential then. Thread-safe. A stop
** that `ws` (the calling state's watches, or NULL) says, or a signal the
** calling thread trapped, ends the run at once: the plugin's group is
** killed and -1 returned. */
int cozy_exec_run(struct cozy_exec *ex, struct cozy_kubeconfig *kc, int renew, const struct cozy_watches *ws,
                  char *err, size_t errlen);
/* 1 when the credential has expired (its expirationTimestamp has passed). */
int cozy_exec_expired(const struct cozy_exec *ex);
void cozy_exec_free(struct cozy_exec *ex);

#endif
