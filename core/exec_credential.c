/*
** Exec credential plugins (see exec_credential.h): the environment the
** plugin gets (ours, its kubeconfig env, KUBERNETES_EXEC_INFO), the run
** (fork and exec, a bounded read of stdout, a bounded wait), and the
** ExecCredential it prints, read with libyaml (JSON is YAML) into the
** client's credential. Messages name the plugin and what went wrong, never
** what it printed.
*/
#define _GNU_SOURCE /* pipe2, close_range */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <yaml.h>

#include "clock.h"
#include "exec_credential.h"
#include "guardian.h"
#include "kubeconfig.h"
#include "proc.h"
#include "signals.h"
#include "watch.h"

extern char **environ;

static int fail(char *err, size_t errlen, const struct cozy_exec *ex, const char *fmt, ...) {
  va_list ap;
  int n = snprintf(err, errlen, "%s: %s: exec plugin %s: ", ex->file, ex->field, ex->command);
  if (n < 0 || (size_t)n >= errlen) return -1;
  va_start(ap, fmt);
  vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

void cozy_exec_free(struct cozy_exec *ex) {
  char **p;
  if (ex == NULL) return;
  free(ex->file);
  free(ex->field);
  free(ex->command);
  free(ex->path);
  for (p = ex->argv; p && *p; p++) free(*p);
  free(ex->argv);
  for (p = ex->env; p && *p; p++) {
    OPENSSL_cleanse(*p, strlen(*p)); /* env values may be secrets (a client secret) */
    free(*p);
  }
  free(ex->env);
  free(ex->api_version);
  free(ex->install_hint);
  free(ex);
}

int cozy_exec_expired(const struct cozy_exec *ex) {
  return ex->expires_at > 0 && (double)time(NULL) >= ex->expires_at;
}

/* ---- KUBERNETES_EXEC_INFO ---- */

struct text {
  char *s;
  size_t len, cap;
  int oom;
};

static void put(struct text *t, const char *s, size_t n) {
  if (t->oom) return;
  if (t->len + n + 1 > t->cap) {
    size_t cap = (t->cap ? t->cap : 256);
    char *ns;
    while (cap < t->len + n + 1) cap *= 2;
    ns = realloc(t->s, cap);
    if (ns == NULL) {
      t->oom = 1;
      return;
    }
    t->s = ns;
    t->cap = cap;
  }
  memcpy(t->s + t->len, s, n);
  t->len += n;
  t->s[t->len] = '\0';
}

static void puts_(struct text *t, const char *s) {
  put(t, s, strlen(s));
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void put_json_string(struct text *t, const char *s) {
  put(t, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      put(t, esc, 2);
    } else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      put(t, esc, 6);
    } else {
      put(t, (const char *)&c, 1);
    }
  }
  put(t, "\"", 1);
}

/* The ExecCredential client-go puts in KUBERNETES_EXEC_INFO: the API
** version, whether the plugin may talk to the operator, and, with
** provideClusterInfo, the cluster it authenticates to. */
static char *exec_info(const struct cozy_exec *ex, const struct cozy_kubeconfig *kc, int interactive) {
  struct text t = {NULL, 0, 0, 0};
  puts_(&t, "KUBERNETES_EXEC_INFO={\"kind\":\"ExecCredential\",\"apiVersion\":");
  put_json_string(&t, ex->api_version);
  puts_(&t, ",\"spec\":{");
  if (ex->provide_cluster_info) {
    puts_(&t, "\"cluster\":{\"server\":");
    put_json_string(&t, kc->server);
    if (kc->tls_server_name) {
      puts_(&t, ",\"tls-server-name\":");
      put_json_string(&t, kc->tls_server_name);
    }
    if (kc->proxy_url) {
      puts_(&t, ",\"proxy-url\":");
      put_json_string(&t, kc->proxy_url);
    }
    if (kc->insecure) puts_(&t, ",\"insecure-skip-tls-verify\":true");
    if (kc->ca.data && kc->ca.len > 0 && kc->ca.len < INT_MAX / 2) {
      size_t n = 4 * ((kc->ca.len + 2) / 3) + 1;
      char *b64 = malloc(n);
      if (b64 == NULL) t.oom = 1;
      else {
        EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)kc->ca.data, (int)kc->ca.len);
        puts_(&t, ",\"certificate-authority-data\":");
        put_json_string(&t, b64);
        free(b64);
      }
    }
    puts_(&t, "},");
  }
  puts_(&t, interactive ? "\"interactive\":true}}" : "\"interactive\":false}}");
  if (t.oom) {
    free(t.s);
    return NULL;
  }
  return t.s;
}

/* Our environment, then the kubeconfig's env (which wins), then
** KUBERNETES_EXEC_INFO: a NULL-terminated array whose strings belong to
** their owners, except the last one (info). */
static char **plugin_env(const struct cozy_exec *ex, char *info) {
  size_t n = 0, m = 0, i, j;
  char **envp;
  for (i = 0; environ[i]; i++) n++;
  for (i = 0; ex->env[i]; i++) m++;
  envp = calloc(n + m + 2, sizeof *envp);
  if (envp == NULL) return NULL;
  n = 0;
  for (i = 0; environ[i]; i++) {
    size_t klen = strcspn(environ[i], "=");
    int shadowed = strncmp(environ[i], "KUBERNETES_EXEC_INFO=", 21) == 0;
    for (j = 0; ex->env[j] && !shadowed; j++) shadowed = strncmp(ex->env[j], environ[i], klen + 1) == 0;
    if (!shadowed) envp[n++] = environ[i];
  }
  for (j = 0; ex->env[j]; j++) envp[n++] = ex->env[j];
  envp[n++] = info;
  envp[n] = NULL;
  return envp;
}

/* ---- running it ---- */

/* The command as client-go finds it (Go's exec.LookPath): a name with no
** slash is looked up in $PATH, anything else is a path (kubeconfig.c
** resolved a relative one). An empty PATH element means the current
** directory, and a relative one a directory under it: since Go 1.19 a
** command found there is refused (exec.ErrDot), never run, for it may be
** anything the directory holds. Returns the path, or NULL with errno
** (ENOENT: not found; EPERM: found first through such an element, whose
** path *dot then holds, for the message). Also the lookup of a
** migration's declared tools (sys.find_command). */
char *cozy_find_command(const char *command, char *dot, size_t dotlen) {
  const char *path = getenv("PATH");
  if (strchr(command, '/')) return strdup(command);
  if (path == NULL || *path == '\0') path = "/usr/local/bin:/usr/bin:/bin";
  for (;;) {
    size_t dlen = strcspn(path, ":");
    /* Go: an empty element is "." */
    const char *dir = dlen ? path : ".";
    int dirlen = dlen ? (int)dlen : 1;
    size_t n = (size_t)dirlen + strlen(command) + 2;
    char *p = malloc(n);
    struct stat st;
    if (p == NULL) return NULL;
    snprintf(p, n, "%.*s/%s", dirlen, dir, command);
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0) {
      if (p[0] == '/') return p;
      snprintf(dot, dotlen, "%s", p);
      free(p);
      errno = EPERM;
      return NULL;
    }
    free(p);
    path += dlen;
    if (*path != ':') break;
    path++; /* a trailing ':' is one more, empty, element */
  }
  errno = ENOENT;
  return NULL;
}

/* The child, after fork: async-signal-safe calls only. fds 0-2 and the
** exec report pipe (fd 3, closed by a successful exec) and nothing else.
** A plugin that may prompt keeps our stdin and our process group (in a
** group of its own it could not read the terminal: SIGTTIN). */
static void child(const struct cozy_exec *ex, char **envp, int interactive, int out_w, int report_w) {
  int e, null;
  ssize_t w;
  if (!interactive) setpgid(0, 0);
  cozy_signals_child_defaults();
  dup2(out_w, 1);
  if (!interactive) {
    null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
  }
  if (report_w != 3) report_w = dup3(report_w, 3, O_CLOEXEC) == 3 ? 3 : report_w;
  cozy_close_from(report_w == 3 ? 4 : 3);
  execve(ex->path, ex->argv, envp);
  e = errno;
  w = write(report_w, &e, sizeof e);
  (void)w;
  _exit(127);
}

/* Reaps the plugin, its guardian first (which must not outlive the group's id). */
static void reap(pid_t pid, struct cozy_guardian *g, int *status) {
  cozy_guardian_finish(g);
  while (waitpid(pid, status, 0) < 0 && errno == EINTR) {}
}

/* Ends the plugin (its group, unless it shares ours) and reaps it. */
static void stop_child(pid_t pid, int interactive, struct cozy_guardian *g) {
  int st;
  if (interactive) kill(pid, SIGKILL);
  else kill(-pid, SIGKILL);
  reap(pid, g, &st);
}

#define TIMED_OUT "did not finish within %g s (killed)"

/* Reads the plugin's stdout until EOF, then waits for it to exit, both by
** `deadline`; a stop the caller's watches (or, without one, a signal this
** thread trapped) say ends it at once, the plugin's group killed: a plugin
** that ignores SIGTERM cannot hold a stopping runner for its whole time
** limit. Returns 0 with *status, or -1 with err (the child is gone). */
static int collect(const struct cozy_exec *ex, pid_t pid, int interactive, int out_r, double deadline,
                   const struct cozy_watches *ws, struct cozy_guardian *g, struct cozy_blob *out, int *status,
                   char *err, size_t errlen) {
  size_t cap = 0;
  int eof = 0;
  for (;;) {
    double now = cozy_monotime(), left = deadline - now, detail = 0;
    int r, stop = cozy_watch_poll(ws, now, &detail);
    if (stop == COZY_STOP_SIGNAL) {
      stop_child(pid, interactive, g);
      return fail(err, errlen, ex, "stopped by signal %d (killed)", (int)detail);
    }
    if (stop != COZY_GO) {
      stop_child(pid, interactive, g);
      return fail(err, errlen, ex, "stopped: the step's time limit has passed (killed)");
    }
    if (eof) {
      /* its exit is seen without reaping it, so that its group id cannot be
      ** reused while what it left behind in the group is killed */
      siginfo_t si;
      si.si_pid = 0;
      r = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT);
      if (r == 0 && si.si_pid == pid) {
        if (!interactive) kill(-pid, SIGKILL);
        reap(pid, g, status);
        return 0;
      }
      if (r < 0 && errno != EINTR) {
        stop_child(pid, interactive, g);
        return fail(err, errlen, ex, "waitid: %s", strerror(errno));
      }
    }
    if (left <= 0) {
      stop_child(pid, interactive, g);
      return fail(err, errlen, ex, TIMED_OUT, ex->timeout);
    }
    if (eof) { /* stdout closed, the process still runs: check again shortly */
      poll(NULL, 0, left < 0.01 ? (int)(left * 1000) + 1 : 10);
      continue;
    }
    {
      struct pollfd p = {out_r, POLLIN, 0};
      int ms = left > 0.1 ? 100 : (int)(left * 1000) + 1, pr = poll(&p, 1, ms);
      ssize_t n;
      if (pr < 0 && errno != EINTR) {
        stop_child(pid, interactive, g);
        return fail(err, errlen, ex, "poll: %s", strerror(errno));
      }
      if (pr <= 0) continue;
      if (cap - out->len < 4096) {
        size_t ncap = cap ? cap * 2 : 8192;
        char *nbuf = malloc(ncap + 1);
        if (nbuf == NULL) {
          stop_child(pid, interactive, g);
          return fail(err, errlen, ex, "out of memory");
        }
        if (out->data) {
          memcpy(nbuf, out->data, out->len);
          OPENSSL_cleanse(out->data, cap);
          free(out->data);
        }
        out->data = nbuf;
        cap = ncap;
      }
      n = read(out_r, out->data + out->len, cap - out->len);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        stop_child(pid, interactive, g);
        return fail(err, errlen, ex, "reading its output: %s", strerror(errno));
      }
      if (n == 0) eof = 1;
      out->len += (size_t)n;
      out->data[out->len] = '\0';
      if (out->len > COZY_MAX_EXEC_OUTPUT) {
        stop_child(pid, interactive, g);
        return fail(err, errlen, ex, "printed more than %u bytes, the limit for an ExecCredential (killed)",
                    COZY_MAX_EXEC_OUTPUT);
      }
    }
  }
}

/* Runs the plugin; its stdout into out. A plugin in a group of its own has
** a guardian (core/guardian.c): killed with its group when the runner dies,
** or at its time limit should the runner be frozen. */
static int run(const struct cozy_exec *ex, char **envp, int interactive, const struct cozy_watches *ws,
               struct cozy_blob *out, char *err, size_t errlen) {
  int outp[2], rep[2], status = 0, e = 0;
  ssize_t n;
  pid_t pid;
  double deadline;
  struct cozy_guardian g = {0, -1, 0};
  if (pipe2(outp, O_CLOEXEC) != 0) return fail(err, errlen, ex, "pipe: %s", strerror(errno));
  if (pipe2(rep, O_CLOEXEC) != 0) {
    e = errno;
    close(outp[0]);
    close(outp[1]);
    return fail(err, errlen, ex, "pipe: %s", strerror(e));
  }
  pid = fork();
  if (pid == 0) child(ex, envp, interactive, outp[1], rep[1]);
  e = errno;
  close(outp[1]);
  close(rep[1]);
  if (pid < 0) {
    close(outp[0]);
    close(rep[0]);
    return fail(err, errlen, ex, "fork: %s", strerror(e));
  }
  deadline = cozy_monotime() + ex->timeout;
  if (!interactive) {
    setpgid(pid, pid); /* as the child does: whichever runs first */
    if (cozy_guardian_start(&g, pid, deadline, NULL, NULL) != 0) {
      e = errno;
      close(outp[0]);
      close(rep[0]);
      stop_child(pid, interactive, &g);
      return fail(err, errlen, ex, "cannot start its guardian: %s", strerror(e));
    }
  }
  do n = read(rep[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  close(rep[0]);
  if (n == (ssize_t)sizeof e) { /* exec failed */
    close(outp[0]);
    stop_child(pid, interactive, &g);
    return fail(err, errlen, ex, "cannot run %s: %s%s%s", ex->path, strerror(e), ex->install_hint ? "; " : "",
                ex->install_hint ? ex->install_hint : "");
  }
  e = collect(ex, pid, interactive, outp[0], deadline, ws, &g, out, &status, err, errlen);
  close(outp[0]);
  if (e != 0) return -1;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && !interactive && cozy_monotime() >= deadline)
    /* its guardian kills it at the same time limit, and may do so a moment
    ** before collect looks at the clock: the cause is the time limit */
    return fail(err, errlen, ex, TIMED_OUT, ex->timeout);
  if (WIFSIGNALED(status))
    return fail(err, errlen, ex, "was killed by signal %d (its stderr is above)", WTERMSIG(status));
  if (WEXITSTATUS(status) != 0)
    return fail(err, errlen, ex, "exited with status %d (its stderr is above)", WEXITSTATUS(status));
  return 0;
}

/* ---- the ExecCredential ---- */

/* A string field: 0 absent or empty, 1 set (*out, *len), -1 not a string. */
static int str_field(yaml_document_t *doc, yaml_node_t *map, const char *key, const char **out, size_t *len) {
  yaml_node_t *n = cozy_yaml_get(doc, map, key);
  if (n == NULL) return 0;
  if (n->type != YAML_SCALAR_NODE) return -1;
  if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
      strcmp((const char *)n->data.scalar.value, "null") == 0)
    return 0;
  if (n->data.scalar.length == 0) return 0;
  *out = (const char *)n->data.scalar.value;
  *len = n->data.scalar.length;
  return 1;
}

/* RFC 3339 ("2026-12-04T16:20:00Z", fractions and offsets too) to time(2)
** seconds; -1 when it is not one. */
static double rfc3339(const char *s) {
  struct tm tm;
  int y, mo, d, h, mi, sec, n = 0, oh = 0, om = 0;
  double frac = 0;
  time_t t;
  if (sscanf(s, "%4d-%2d-%2d%*[Tt]%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 || n == 0) return -1;
  s += n;
  if (*s == '.') {
    double scale = 0.1;
    for (s++; isdigit((unsigned char)*s); s++, scale /= 10) frac += (*s - '0') * scale;
  }
  if (*s == 'Z' || *s == 'z') s++;
  else if ((*s == '+' || *s == '-') && sscanf(s + 1, "%2d:%2d", &oh, &om) == 2) {
    int sign = *s == '-' ? -1 : 1;
    oh *= sign;
    om *= sign;
    s += 6;
  } else return -1;
  if (*s != '\0' || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return -1;
  memset(&tm, 0, sizeof tm);
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  t = timegm(&tm);
  return (double)t + frac - oh * 3600.0 - om * 60.0;
}

static int copy_blob(struct cozy_blob *b, const char *s, size_t len) {
  b->data = malloc(len + 1);
  if (b->data == NULL) return -1;
  memcpy(b->data, s, len);
  b->data[len] = '\0';
  b->len = len;
  return 0;
}

/* The credential fields of a loaded ExecCredential, checked as client-go
** does, into token/cert/key/expires. */
static int read_credential(const struct cozy_exec *ex, yaml_document_t *doc, struct cozy_blob *token,
                           struct cozy_blob *cert, struct cozy_blob *key, double *expires, char *err,
                           size_t errlen) {
  yaml_node_t *root = yaml_document_get_root_node(doc), *status;
  const char *v = NULL, *tok = NULL, *c = NULL, *k = NULL;
  size_t vl = 0, tl = 0, cl = 0, kl = 0;
  int rt, rc, rk;
  if (root == NULL || root->type != YAML_MAPPING_NODE)
    return fail(err, errlen, ex, "its output is not an ExecCredential (not a JSON object)");
  if (str_field(doc, root, "apiVersion", &v, &vl) != 1 || strcmp(v, ex->api_version) != 0)
    return fail(err, errlen, ex, "is configured to use API version %s, the plugin returned %s",
                ex->api_version, v && vl < 100 ? v : "none");
  if (str_field(doc, root, "kind", &v, &vl) != 1 || strcmp(v, "ExecCredential") != 0)
    return fail(err, errlen, ex, "its output is not an ExecCredential (kind)");
  status = cozy_yaml_get(doc, root, "status");
  if (status == NULL || status->type != YAML_MAPPING_NODE)
    return fail(err, errlen, ex, "its ExecCredential has no status");
  rt = str_field(doc, status, "token", &tok, &tl);
  rc = str_field(doc, status, "clientCertificateData", &c, &cl);
  rk = str_field(doc, status, "clientKeyData", &k, &kl);
  if (rt < 0 || rc < 0 || rk < 0)
    return fail(err, errlen, ex, "its ExecCredential has a status field that is not a string");
  if ((rc == 1) != (rk == 1))
    return fail(err, errlen, ex, "returned %s without %s",
                rc == 1 ? "clientCertificateData" : "clientKeyData",
                rc == 1 ? "clientKeyData" : "clientCertificateData");
  if (rt == 0 && rc == 0) return fail(err, errlen, ex, "returned neither a token nor a client certificate");
  if (rt == 1) {
    struct cozy_blob tb;
    tb.data = (char *)tok;
    tb.len = tl;
    if (cozy_token_invalid(&tb))
      return fail(err, errlen, ex,
                  "returned a token with a CR, LF, NUL or other control character; it cannot be sent "
                  "in an Authorization header");
  }
  *expires = 0;
  if (str_field(doc, status, "expirationTimestamp", &v, &vl) == 1) {
    *expires = rfc3339(v);
    if (*expires < 0) return fail(err, errlen, ex, "returned an expirationTimestamp that is not RFC 3339");
  }
  if (rt == 1 && copy_blob(token, tok, tl) != 0) return fail(err, errlen, ex, "out of memory");
  if (rc == 1 && (copy_blob(cert, c, cl) != 0 || copy_blob(key, k, kl) != 0))
    return fail(err, errlen, ex, "out of memory");
  return 0;
}

/* Wipes every scalar (a token, a key) before the document goes. */
static void doc_free(yaml_document_t *doc) {
  yaml_node_t *n;
  for (n = doc->nodes.start; n < doc->nodes.top; n++)
    if (n->type == YAML_SCALAR_NODE) OPENSSL_cleanse(n->data.scalar.value, n->data.scalar.length);
  yaml_document_delete(doc);
}

static int parse(const struct cozy_exec *ex, const struct cozy_blob *out, struct cozy_blob *token,
                 struct cozy_blob *cert, struct cozy_blob *key, double *expires, char *err, size_t errlen) {
  yaml_parser_t parser;
  yaml_document_t doc;
  int rc;
  if (out->len == 0) return fail(err, errlen, ex, "printed nothing (an ExecCredential was expected)");
  if (!yaml_parser_initialize(&parser)) return fail(err, errlen, ex, "out of memory");
  yaml_parser_set_input_string(&parser, (const unsigned char *)out->data, out->len);
  if (!yaml_parser_load(&parser, &doc)) {
    rc = fail(err, errlen, ex, "its output is not an ExecCredential (not JSON: %s at line %lu)",
              parser.problem ? parser.problem : "parse error", (unsigned long)parser.problem_mark.line + 1);
    yaml_parser_delete(&parser);
    return rc;
  }
  yaml_parser_delete(&parser);
  rc = read_credential(ex, &doc, token, cert, key, expires, err, errlen);
  doc_free(&doc);
  return rc;
}

/* ---- the process's credentials ----
** As client-go's cache: the clients of one process that run the same
** plugin the same way (the runner's, its lease renewer's in another
** thread, check's probe) share what it returned, instead of running it (and
** maybe prompting) again. The key is the command, its arguments, its
** environment and KUBERNETES_EXEC_INFO; it and the credential are secrets
** (wiped when replaced). */
struct cached {
  struct text key;
  struct cozy_blob token, cert, pkey;
  double expires_at;
  struct cached *next;
};
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cached *cache;

static void cache_key(const struct cozy_exec *ex, const char *info, struct text *key) {
  char **p;
  puts_(key, ex->path);
  for (p = ex->argv; *p; p++) put(key, *p, strlen(*p) + 1); /* with its '\0': "a" "bc" != "ab" "c" */
  put(key, "\1", 1);
  for (p = ex->env; *p; p++) put(key, *p, strlen(*p) + 1);
  put(key, "\1", 1);
  puts_(key, info);
}

static int blob_dup(struct cozy_blob *dst, const struct cozy_blob *src) {
  dst->data = NULL;
  dst->len = 0;
  return src->data ? copy_blob(dst, src->data, src->len) : 0;
}

static void text_wipe(struct text *t) {
  if (t->s) OPENSSL_cleanse(t->s, t->cap);
  free(t->s);
  t->s = NULL;
  t->len = t->cap = 0;
}

static struct cached *cache_find(const struct text *key) {
  struct cached *c;
  for (c = cache; c; c = c->next)
    if (c->key.len == key->len && memcmp(c->key.s, key->s, key->len) == 0) return c;
  return NULL;
}

/* Copies of the cached credential that has not expired: 0, else -1. */
static int cache_get(const struct text *key, struct cozy_blob *token, struct cozy_blob *cert,
                     struct cozy_blob *pkey, double *expires) {
  struct cached *c;
  int rc = -1;
  pthread_mutex_lock(&cache_lock);
  c = cache_find(key);
  if (c && !(c->expires_at > 0 && (double)time(NULL) >= c->expires_at)) {
    if (blob_dup(token, &c->token) == 0 && blob_dup(cert, &c->cert) == 0 && blob_dup(pkey, &c->pkey) == 0) {
      *expires = c->expires_at;
      rc = 0;
    }
  }
  pthread_mutex_unlock(&cache_lock);
  return rc;
}

/* Keeps copies of a credential the plugin returned (out of memory: not kept). */
static void cache_put(const struct text *key, const struct cozy_blob *token, const struct cozy_blob *cert,
                      const struct cozy_blob *pkey, double expires) {
  struct cached fresh, *c;
  memset(&fresh, 0, sizeof fresh);
  put(&fresh.key, key->s, key->len);
  if (fresh.key.oom || blob_dup(&fresh.token, token) != 0 || blob_dup(&fresh.cert, cert) != 0 ||
      blob_dup(&fresh.pkey, pkey) != 0)
    goto drop;
  fresh.expires_at = expires;
  pthread_mutex_lock(&cache_lock);
  c = cache_find(key);
  if (c == NULL && (c = calloc(1, sizeof *c)) != NULL) {
    c->next = cache;
    cache = c;
    c->key = fresh.key;
    fresh.key.s = NULL;
  }
  if (c != NULL) {
    struct cozy_blob t = c->token, ce = c->cert, k = c->pkey;
    c->token = fresh.token;
    c->cert = fresh.cert;
    c->pkey = fresh.pkey;
    c->expires_at = expires;
    fresh.token = t; /* the old ones, wiped below */
    fresh.cert = ce;
    fresh.pkey = k;
  }
  pthread_mutex_unlock(&cache_lock);
drop:
  text_wipe(&fresh.key);
  cozy_blob_free(&fresh.token);
  cozy_blob_free(&fresh.cert);
  cozy_blob_free(&fresh.pkey);
}

int cozy_exec_run(struct cozy_exec *ex, struct cozy_kubeconfig *kc, int renew, const struct cozy_watches *ws,
                  char *err, size_t errlen) {
  struct cozy_blob out = {NULL, 0}, token = {NULL, 0}, cert = {NULL, 0}, key = {NULL, 0};
  int tty = isatty(0), interactive, rc = -1;
  double expires = 0;
  char *info = NULL, **envp = NULL, dot[512];
  struct text ckey = {NULL, 0, 0, 0};
  /* client-go: Never never prompts; IfAvailable prompts when stdin is a
  ** terminal; Always needs one */
  if (ex->interactive_mode == COZY_EXEC_ALWAYS && !tty)
    return fail(err, errlen, ex,
                "needs an interactive terminal (interactiveMode: Always) and standard input is not one");
  interactive = ex->interactive_mode != COZY_EXEC_NEVER && tty;
  if (ex->path == NULL && (ex->path = cozy_find_command(ex->command, dot, sizeof dot)) == NULL) {
    if (errno == EPERM)
      return fail(err, errlen, ex,
                  "found in PATH as %s, relative to the current directory (an empty or relative PATH "
                  "element): not run, as client-go refuses it (exec.ErrDot); put the plugin's directory in "
                  "PATH as an absolute path, or give exec.command as a path",
                  dot);
    if (errno != ENOENT) return fail(err, errlen, ex, "out of memory");
    return fail(err, errlen, ex, "not found in PATH%s%s", ex->install_hint ? "; " : "",
                ex->install_hint ? ex->install_hint : "");
  }
  info = exec_info(ex, kc, interactive);
  if (info) cache_key(ex, info, &ckey);
  if (info && !ckey.oom && !renew && cache_get(&ckey, &token, &cert, &key, &expires) == 0) {
    rc = 0; /* another client of this process ran it */
  } else {
    envp = info ? plugin_env(ex, info) : NULL;
    if (envp == NULL) fail(err, errlen, ex, "out of memory");
    else if (run(ex, envp, interactive, ws, &out, err, errlen) == 0 &&
             parse(ex, &out, &token, &cert, &key, &expires, err, errlen) == 0)
      rc = 0;
    if (rc == 0 && !ckey.oom) cache_put(&ckey, &token, &cert, &key, expires);
  }
  text_wipe(&ckey);
  free(envp);
  free(info);
  cozy_blob_free(&out);
  if (rc != 0) {
    cozy_blob_free(&token);
    cozy_blob_free(&cert);
    cozy_blob_free(&key);
    return -1;
  }
  cozy_blob_free(&kc->token);
  cozy_blob_free(&kc->cert);
  cozy_blob_free(&kc->key);
  kc->token = token;
  kc->cert = cert;
  kc->key = key;
  ex->expires_at = expires;
  return 0;
}
