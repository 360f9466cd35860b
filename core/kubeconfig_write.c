/*
** The kubeconfig a legacy script gets: one cluster, one user and one
** context, exactly what the engine resolved and locked (kubeconfig.c), so
** that nothing the script's kubectl reads (a current-context, another
** context, $KUBECONFIG, the in-cluster service account) can point it at
** another cluster. Written as JSON (a kubeconfig is YAML, and JSON is YAML)
** into a fresh file, mode 0600, in a directory of its own, mode 0700.
** Secrets (token, client key) go from kc straight into a buffer that is
** wiped before it is freed; no message quotes them.
*/
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "exec_credential.h"
#include "kubeconfig.h"
#include "kubeconfig_write.h"

struct out {
  char *s;
  size_t len, cap;
  int oom;
};

static void out_free(struct out *o) {
  if (o->s) OPENSSL_cleanse(o->s, o->cap);
  free(o->s);
  o->s = NULL;
  o->len = o->cap = 0;
}

/* Grows by copying into a new buffer and wiping the old one: realloc would
** leave the secrets written so far in freed memory. */
static int room(struct out *o, size_t need) {
  char *s;
  size_t cap;
  if (o->oom) return -1;
  if (o->len + need + 1 <= o->cap) return 0;
  cap = o->cap ? o->cap : 4096;
  while (cap < o->len + need + 1) cap *= 2;
  if ((s = malloc(cap)) == NULL) {
    o->oom = 1;
    return -1;
  }
  if (o->s) memcpy(s, o->s, o->len);
  out_free(o);
  o->s = s;
  o->cap = cap;
  return 0;
}

static void put(struct out *o, const char *s, size_t n) {
  if (room(o, n) < 0) return;
  memcpy(o->s + o->len, s, n);
  o->len += n;
  o->s[o->len] = '\0';
}

static void put_str(struct out *o, const char *s) {
  put(o, s, strlen(s));
}

/* A JSON string: '"' and '\\' escaped, control bytes as \u00XX, the rest
** (UTF-8 included) as it is. */
static void str(struct out *o, const char *s, size_t n) {
  size_t i;
  put(o, "\"", 1);
  for (i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      put(o, esc, 2);
    } else if (c < 0x20 || c == 0x7f) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      put(o, esc, 6);
    } else put(o, (const char *)&s[i], 1);
  }
  put(o, "\"", 1);
}

static void key_str(struct out *o, const char *key, const char *value) {
  str(o, key, strlen(key));
  put(o, ":", 1);
  str(o, value, strlen(value));
}

/* "key":"<base64 of blob>" */
static void key_b64(struct out *o, const char *key, const struct cozy_blob *b) {
  size_t n = 4 * ((b->len + 2) / 3);
  str(o, key, strlen(key));
  put(o, ":\"", 2);
  if (room(o, n + 1) < 0) return;
  o->len +=
      (size_t)EVP_EncodeBlock((unsigned char *)o->s + o->len, (const unsigned char *)b->data, (int)b->len);
  o->s[o->len] = '\0';
  put(o, "\"", 1);
}

/* An absolute form of path p (the script runs from another directory):
** realpath when it resolves, else the working directory joined to it. */
static char *absolute(const char *p) {
  char *r, cwd[PATH_MAX];
  size_t n;
  if (p[0] == '/') return strdup(p);
  if ((r = realpath(p, NULL)) != NULL) return r;
  if (getcwd(cwd, sizeof cwd) == NULL) return strdup(p);
  n = strlen(cwd) + strlen(p) + 2;
  if ((r = malloc(n)) != NULL) snprintf(r, n, "%s/%s", cwd, p);
  return r;
}

static void key_path(struct out *o, const char *key, const char *p) {
  char *a = absolute(p);
  if (a == NULL) {
    o->oom = 1;
    return;
  }
  key_str(o, key, a);
  free(a);
}

static const char *interactive_names[] = {"Never", "IfAvailable", "Always"};

static void exec_stanza(struct out *o, const struct cozy_exec *e, int first) {
  char **p;
  put_str(o, first ? "\"exec\":{" : ",\"exec\":{");
  key_str(o, "apiVersion", e->api_version);
  put(o, ",", 1);
  /* a command with a '/' was resolved against its kubeconfig's directory;
  ** a bare name is looked up in PATH, by kubectl as by us */
  if (e->path) key_path(o, "command", e->path);
  else key_str(o, "command", e->command);
  put_str(o, ",\"args\":[");
  for (p = e->argv ? e->argv + 1 : NULL; p && *p; p++) {
    if (p != e->argv + 1) put(o, ",", 1);
    str(o, *p, strlen(*p));
  }
  put_str(o, "],\"env\":[");
  for (p = e->env; p && *p; p++) {
    const char *eq = strchr(*p, '=');
    size_t namelen = eq ? (size_t)(eq - *p) : strlen(*p);
    if (p != e->env) put(o, ",", 1);
    put_str(o, "{\"name\":");
    str(o, *p, namelen);
    put_str(o, ",\"value\":");
    str(o, eq ? eq + 1 : "", eq ? strlen(eq + 1) : 0);
    put(o, "}", 1);
  }
  put_str(o, "],");
  key_str(o, "interactiveMode", interactive_names[e->interactive_mode]);
  put_str(o, e->provide_cluster_info ? ",\"provideClusterInfo\":true" : ",\"provideClusterInfo\":false");
  if (e->install_hint) {
    put(o, ",", 1);
    key_str(o, "installHint", e->install_hint);
  }
  put(o, "}", 1);
}

/* The user's impersonation, as kubectl reads it (as, as-uid, as-groups,
** as-user-extra), so that a script's kubectl acts as the engine does.
** as_extra holds a key once per value, each key's values in a row. */
static void impersonation(struct out *o, const struct cozy_kubeconfig *kc, int first) {
  char **p;
  if (kc->as_user == NULL) return;
  if (!first) put(o, ",", 1);
  key_str(o, "as", kc->as_user);
  if (kc->as_uid) {
    put(o, ",", 1);
    key_str(o, "as-uid", kc->as_uid);
  }
  if (kc->as_groups) {
    put_str(o, ",\"as-groups\":[");
    for (p = kc->as_groups; *p; p++) {
      if (p != kc->as_groups) put(o, ",", 1);
      str(o, *p, strlen(*p));
    }
    put(o, "]", 1);
  }
  if (kc->as_extra && kc->as_extra[0]) {
    put_str(o, ",\"as-user-extra\":{");
    for (p = kc->as_extra; p[0] && p[1]; p += 2) {
      int same = p != kc->as_extra && strcmp(p[-2], p[0]) == 0;
      if (!same) {
        if (p != kc->as_extra) put_str(o, "],");
        str(o, p[0], strlen(p[0]));
        put_str(o, ":[");
      } else put(o, ",", 1);
      str(o, p[1], strlen(p[1]));
    }
    put_str(o, "]}");
  }
}

/* The document, into o. */
static void document(struct out *o, const struct cozy_kubeconfig *kc, const char *name, const char *ns) {
  put_str(o, "{\"apiVersion\":\"v1\",\"kind\":\"Config\",\"preferences\":{},\"clusters\":[{");
  key_str(o, "name", name);
  put_str(o, ",\"cluster\":{");
  key_str(o, "server", kc->server);
  if (kc->ca.data && kc->ca.len > 0) {
    put(o, ",", 1);
    key_b64(o, "certificate-authority-data", &kc->ca);
  }
  if (kc->insecure) put_str(o, ",\"insecure-skip-tls-verify\":true");
  if (kc->tls_server_name) {
    put(o, ",", 1);
    key_str(o, "tls-server-name", kc->tls_server_name);
  }
  if (kc->proxy_url) {
    put(o, ",", 1);
    key_str(o, "proxy-url", kc->proxy_url);
  }
  put_str(o, "}}],\"users\":[{");
  key_str(o, "name", name);
  put_str(o, ",\"user\":{");
  {
    int first = 1;
    if (kc->cert.data) {
      key_b64(o, "client-certificate-data", &kc->cert);
      put(o, ",", 1);
      key_b64(o, "client-key-data", &kc->key);
      first = 0;
    }
    if (kc->token_file) {
      /* the file, not its token: a token rotated while the script runs is seen */
      if (!first) put(o, ",", 1);
      key_path(o, "tokenFile", kc->token_file);
      first = 0;
    } else if (kc->token.data) {
      if (!first) put(o, ",", 1);
      str(o, "token", 5);
      put(o, ":", 1);
      str(o, kc->token.data, kc->token.len);
      first = 0;
    }
    if (kc->exec) {
      exec_stanza(o, kc->exec, first);
      first = 0;
    }
    impersonation(o, kc, first);
  }
  put_str(o, "}}],\"contexts\":[{");
  key_str(o, "name", name);
  put_str(o, ",\"context\":{");
  key_str(o, "cluster", name);
  put(o, ",", 1);
  key_str(o, "user", name);
  put(o, ",", 1);
  key_str(o, "namespace", ns);
  put_str(o, "}}],");
  key_str(o, "current-context", name);
  put_str(o, "}\n");
}

int cozy_kubeconfig_write(const struct cozy_kubeconfig *kc, const char *ns, const char *dir, char *path,
                          size_t pathlen, char *err, size_t errlen) {
  struct out o = {NULL, 0, 0, 0};
  const char *name = kc->context ? kc->context : "in-cluster";
  size_t done = 0;
  int fd, werr = 0, rc = -1;
  if ((size_t)snprintf(path, pathlen, "%s/config", dir) >= pathlen) {
    snprintf(err, errlen, "the kubeconfig path under %s is too long", dir);
    return -1;
  }
  document(&o, kc, name, ns);
  if (o.oom) {
    snprintf(err, errlen, "the scripts' kubeconfig: out of memory");
    goto done;
  }
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
    goto done;
  }
  while (done < o.len && werr == 0) {
    ssize_t n = write(fd, o.s + done, o.len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) werr = n < 0 ? errno : EIO;
    else done += (size_t)n;
  }
  if (close(fd) != 0 && werr == 0) werr = errno;
  if (werr == 0) rc = 0;
  else {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(werr));
    unlink(path);
  }
done:
  out_free(&o);
  return rc;
}
