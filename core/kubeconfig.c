/*
** Kubeconfig and in-cluster configuration (see kubeconfig.h).
**
** The YAML is loaded into libyaml documents and walked by key; with a
** $KUBECONFIG list, every file is loaded and a named cluster, user or context
** is taken from the first file that has it, as kubectl merges them. Error
** messages name the file and the field, never a value (values may be secret).
*/
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <yaml.h>

#include "exec_credential.h"
#include "kubeconfig.h"

#define MAX_FILES 16

struct kfile {
  char *path;
  char *dir; /* relative paths in this file resolve against it */
  yaml_document_t doc;
  int loaded;
};

struct loader {
  struct kfile files[MAX_FILES];
  int nfiles;
  struct cozy_config_error *err;
};

static int fail(struct cozy_config_error *err, const char *file, const char *field, const char *fmt, ...) {
  va_list ap;
  snprintf(err->file, sizeof err->file, "%s", file ? file : "");
  snprintf(err->field, sizeof err->field, "%s", field ? field : "");
  va_start(ap, fmt);
  vsnprintf(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  return -1;
}

void cozy_blob_free(struct cozy_blob *b) {
  if (b->data) {
    OPENSSL_cleanse(b->data, b->len);
    free(b->data);
  }
  b->data = NULL;
  b->len = 0;
}

void cozy_blob_rtrim(struct cozy_blob *b) {
  while (b->len > 0 && isspace((unsigned char)b->data[b->len - 1])) b->data[--b->len] = '\0';
}

int cozy_token_invalid(const struct cozy_blob *token) {
  size_t i;
  for (i = 0; i < token->len; i++) {
    unsigned char c = (unsigned char)token->data[i];
    if (c < 0x20 || c == 0x7f) return 1;
  }
  return 0;
}

int cozy_read_file(const char *path, size_t max, struct cozy_blob *out) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  size_t len = 0, cap = 0, n;
  int e = 0; /* why it failed: one cleanup for every way out */
  if (f == NULL) return -1;
  for (;;) {
    if (len > max) { /* one byte past the limit was read: the file is larger than allowed */
      e = EFBIG;
      break;
    }
    if (cap - len < 4096) {
      /* grow by copying so a secret never lingers in a freed block */
      size_t ncap = cap ? cap * 2 : 8192;
      char *nbuf = malloc(ncap + 1);
      if (nbuf == NULL) {
        e = ENOMEM;
        break;
      }
      if (buf) {
        memcpy(nbuf, buf, len);
        OPENSSL_cleanse(buf, cap);
        free(buf);
      }
      buf = nbuf;
      cap = ncap;
    }
    n = fread(buf + len, 1, (cap - len < max + 1 - len) ? cap - len : max + 1 - len, f);
    len += n;
    if (n == 0) {
      if (ferror(f)) e = errno ? errno : EIO;
      break;
    }
  }
  fclose(f);
  if (e != 0) {
    if (buf) {
      OPENSSL_cleanse(buf, cap);
      free(buf);
    }
    errno = e;
    return -1;
  }
  buf[len] = '\0';
  out->data = buf;
  out->len = len;
  return 0;
}

/* *dst = a copy of src; -1 (err set) when memory runs out. */
static int dup_to(struct cozy_config_error *err, const char *file, char **dst, const char *src) {
  *dst = strdup(src);
  if (*dst == NULL) return fail(err, file, "", "%s: out of memory", file);
  return 0;
}

/* A file read for the configuration, bounded (cozy_read_file): on failure
** err names the file, what it is for and, when it is too large, the limit.
** `context` prefixes the message ("<kubeconfig>: <field>" or "in-cluster
** configuration"). */
static int read_config_file(struct cozy_config_error *err, const char *file, const char *field,
                            const char *context, const char *what, const char *path, size_t max,
                            struct cozy_blob *out) {
  if (cozy_read_file(path, max, out) == 0) return 0;
  if (errno == EFBIG)
    return fail(err, file, field, "%s: %s %s is larger than %zu bytes, the limit for %s", context, what, path,
                max, what);
  return fail(err, file, field, "%s: cannot read %s %s: %s", context, what, path, strerror(errno));
}

/* A token must fit in an HTTP header (see cozy_token_invalid). */
static int check_token(struct cozy_config_error *err, const char *file, const char *field,
                       const char *context, const struct cozy_blob *token) {
  if (!cozy_token_invalid(token)) return 0;
  return fail(err, file, field,
              "%s: the token contains a CR, LF, NUL or other control character; it cannot be "
              "sent in an Authorization header (a line break would start another header)",
              context);
}

/* "where.key" for messages; a field path longer than the buffer is cut. */
static void join(char *dst, size_t n, const char *where, const char *key) {
  if (snprintf(dst, n, "%s.%s", where, key) >= (int)n) dst[n - 1] = '\0';
}

/* ---- YAML walking ---- */

/* The value of `key` in mapping `map`, or NULL (also when map is not a
** mapping). Shared with the ExecCredential reader (exec_credential.c). */
yaml_node_t *cozy_yaml_get(yaml_document_t *doc, yaml_node_t *map, const char *key) {
  yaml_node_pair_t *p;
  if (map == NULL || map->type != YAML_MAPPING_NODE) return NULL;
  for (p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
    yaml_node_t *k = yaml_document_get_node(doc, p->key);
    if (k && k->type == YAML_SCALAR_NODE && strcmp((const char *)k->data.scalar.value, key) == 0)
      return yaml_document_get_node(doc, p->value);
  }
  return NULL;
}

static int is_null(yaml_node_t *n) {
  const char *v;
  if (n == NULL) return 1;
  if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
  v = (const char *)n->data.scalar.value;
  return *v == '\0' || strcmp(v, "null") == 0 || strcmp(v, "~") == 0 || strcmp(v, "Null") == 0 ||
      strcmp(v, "NULL") == 0;
}

/* A string field: 0 absent, 1 present (*out set), -1 wrong type (err set). */
static int get_str(struct loader *ld, struct kfile *f, yaml_node_t *map, const char *key, const char *where,
                   const char **out) {
  yaml_node_t *n = cozy_yaml_get(&f->doc, map, key);
  char field[256];
  if (is_null(n)) return 0;
  if (n->type != YAML_SCALAR_NODE) {
    join(field, sizeof field, where, key);
    return fail(ld->err, f->path, field, "%s: %s must be a string", f->path, field);
  }
  *out = (const char *)n->data.scalar.value;
  return 1;
}

/* The entry of list `section` (clusters, users, contexts) named `name`, from
** the first file that has it; *inner is its `kind` mapping (cluster, user, context). */
static struct kfile *find_named(struct loader *ld, const char *section, const char *kind, const char *name,
                                yaml_node_t **inner) {
  int i;
  for (i = 0; i < ld->nfiles; i++) {
    struct kfile *f = &ld->files[i];
    yaml_node_t *root = yaml_document_get_root_node(&f->doc);
    yaml_node_t *list = cozy_yaml_get(&f->doc, root, section);
    yaml_node_item_t *it;
    if (list == NULL || list->type != YAML_SEQUENCE_NODE) continue;
    for (it = list->data.sequence.items.start; it < list->data.sequence.items.top; it++) {
      yaml_node_t *e = yaml_document_get_node(&f->doc, *it);
      yaml_node_t *n = cozy_yaml_get(&f->doc, e, "name");
      if (n && n->type == YAML_SCALAR_NODE && strcmp((const char *)n->data.scalar.value, name) == 0) {
        *inner = cozy_yaml_get(&f->doc, e, kind);
        return f;
      }
    }
  }
  return NULL;
}

static char *resolve_path(struct kfile *f, const char *p) {
  char *out;
  size_t n;
  if (p[0] == '/' || f->dir == NULL) return strdup(p);
  n = strlen(f->dir) + strlen(p) + 2;
  out = malloc(n);
  if (out) snprintf(out, n, "%s/%s", f->dir, p);
  return out;
}

static int b64decode(const char *in, struct cozy_blob *out) {
  size_t n = strlen(in), i, m = 0, pad = 0;
  char *clean = malloc(n + 1);
  unsigned char *buf;
  int len;
  if (clean == NULL) return -1;
  for (i = 0; i < n; i++)
    if (!isspace((unsigned char)in[i])) clean[m++] = in[i];
  clean[m] = '\0';
  if (m == 0 || m % 4 != 0) {
    OPENSSL_cleanse(clean, n);
    free(clean);
    return -1;
  }
  if (clean[m - 1] == '=') pad++;
  if (clean[m - 2] == '=') pad++;
  buf = malloc(m / 4 * 3 + 1);
  if (buf == NULL) {
    OPENSSL_cleanse(clean, n);
    free(clean);
    return -1;
  }
  len = EVP_DecodeBlock(buf, (const unsigned char *)clean, (int)m);
  OPENSSL_cleanse(clean, n);
  free(clean);
  if (len < 0) {
    free(buf);
    return -1;
  }
  out->len = (size_t)len - pad;
  buf[out->len] = '\0';
  out->data = (char *)buf;
  return 0;
}

/* A PEM blob from `<key>-data` (base64) or `<key>` (a file path). */
static int get_blob(struct loader *ld, struct kfile *f, yaml_node_t *map, const char *key, const char *where,
                    struct cozy_blob *out) {
  char datakey[96], field[256];
  const char *v = NULL;
  int r;
  snprintf(datakey, sizeof datakey, "%s-data", key);
  if ((r = get_str(ld, f, map, datakey, where, &v)) < 0) return -1;
  if (r == 1) {
    join(field, sizeof field, where, datakey);
    if (b64decode(v, out) != 0)
      return fail(ld->err, f->path, field, "%s: %s is not valid base64", f->path, field);
    return 0;
  }
  if ((r = get_str(ld, f, map, key, where, &v)) < 0) return -1;
  if (r == 1) {
    char *p = resolve_path(f, v);
    join(field, sizeof field, where, key);
    if (p == NULL) return fail(ld->err, f->path, field, "out of memory");
    {
      char context[768];
      int r2;
      snprintf(context, sizeof context, "%s: %s", f->path, field);
      r2 = read_config_file(ld->err, f->path, field, context, "the file", p, COZY_MAX_PEM_BYTES, out);
      free(p);
      if (r2 < 0) return -1;
    }
  }
  return 0;
}

/* The nesting of the YAML in text, checked on the event stream before any
** document is built: libyaml's loader has no depth limit, and a 100,000-deep
** file took 22 s to load. Malformed YAML is left for the loader to report. */
static int check_depth(struct loader *ld, const char *path, const struct cozy_blob *text) {
  yaml_parser_t parser;
  yaml_event_t ev;
  int depth = 0, done = 0, rc = 0;
  if (!yaml_parser_initialize(&parser)) return fail(ld->err, path, "", "%s: out of memory", path);
  yaml_parser_set_input_string(&parser, (const unsigned char *)text->data, text->len);
  while (!done && rc == 0) {
    if (!yaml_parser_parse(&parser, &ev)) break;
    switch (ev.type) {
      case YAML_MAPPING_START_EVENT:
      case YAML_SEQUENCE_START_EVENT:
        if (++depth > COZY_MAX_YAML_DEPTH)
          rc = fail(ld->err, path, "",
                    "%s: YAML nested deeper than %d levels at line %lu (the limit for a kubeconfig)", path,
                    COZY_MAX_YAML_DEPTH, (unsigned long)ev.start_mark.line + 1);
        break;
      case YAML_MAPPING_END_EVENT:
      case YAML_SEQUENCE_END_EVENT: depth--; break;
      case YAML_STREAM_END_EVENT: done = 1; break;
      default: break;
    }
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&parser);
  return rc;
}

static int load_file(struct loader *ld, const char *path, int must_exist) {
  struct kfile *f = &ld->files[ld->nfiles];
  struct cozy_blob text = {NULL, 0};
  yaml_parser_t parser;
  yaml_node_t *root;
  const char *slash;
  int rc = -1;
  if (ld->nfiles >= MAX_FILES)
    return fail(ld->err, path, "", "too many kubeconfig files (at most %d)", MAX_FILES);
  if (cozy_read_file(path, COZY_MAX_KUBECONFIG_BYTES, &text) != 0) {
    if (!must_exist && errno == ENOENT) return 0;
    if (errno == EFBIG)
      return fail(ld->err, path, "", "%s: the kubeconfig is larger than %u bytes, the limit for a kubeconfig",
                  path, COZY_MAX_KUBECONFIG_BYTES);
    return fail(ld->err, path, "", "%s: cannot read kubeconfig: %s", path, strerror(errno));
  }
  memset(f, 0, sizeof *f);
  if (check_depth(ld, path, &text) != 0) goto done;
  f->path = strdup(path);
  slash = strrchr(path, '/');
  f->dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : NULL;
  if (f->path == NULL || (slash != NULL && f->dir == NULL) || !yaml_parser_initialize(&parser)) {
    fail(ld->err, path, "", "%s: out of memory", path);
    goto done;
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)text.data, text.len);
  if (yaml_parser_load(&parser, &f->doc)) rc = 0;
  else
    fail(ld->err, path, "", "%s: malformed YAML at line %lu column %lu: %s", path,
         (unsigned long)parser.problem_mark.line + 1, (unsigned long)parser.problem_mark.column + 1,
         parser.problem ? parser.problem : "parse error");
  yaml_parser_delete(&parser);
done: /* the one way out while text (and the file's names) are held */
  cozy_blob_free(&text); /* the document has its own copies (wiped by loader_free) */
  if (rc != 0) {
    free(f->path);
    free(f->dir);
    return -1;
  }
  f->loaded = 1;
  ld->nfiles++;
  root = yaml_document_get_root_node(&f->doc);
  if (root != NULL && root->type != YAML_MAPPING_NODE)
    return fail(ld->err, path, "", "%s: a kubeconfig must be a YAML mapping", path);
  return 0;
}

static void loader_free(struct loader *ld) {
  int i;
  for (i = 0; i < ld->nfiles; i++) {
    /* the document may hold a token or key: wipe scalars before freeing */
    yaml_node_t *n;
    for (n = ld->files[i].doc.nodes.start; n < ld->files[i].doc.nodes.top; n++)
      if (n->type == YAML_SCALAR_NODE) OPENSSL_cleanse(n->data.scalar.value, n->data.scalar.length);
    yaml_document_delete(&ld->files[i].doc);
    free(ld->files[i].path);
    free(ld->files[i].dir);
  }
  ld->nfiles = 0;
}

static void free_strv(char **v) {
  char **p;
  for (p = v; p && *p; p++) free(*p);
  free(v);
}

void cozy_kubeconfig_free(struct cozy_kubeconfig *kc) {
  free(kc->source);
  free(kc->context);
  free(kc->cluster);
  free(kc->user);
  free(kc->server);
  free(kc->namespace);
  free(kc->token_file);
  free(kc->tls_server_name);
  free(kc->proxy_url);
  free(kc->as_user);
  free(kc->as_uid);
  free_strv(kc->as_groups);
  free_strv(kc->as_extra);
  cozy_exec_free(kc->exec);
  cozy_blob_free(&kc->ca);
  cozy_blob_free(&kc->cert);
  cozy_blob_free(&kc->key);
  cozy_blob_free(&kc->token);
  memset(kc, 0, sizeof *kc);
}

static int load_token_file(struct cozy_kubeconfig *kc, struct cozy_config_error *err, const char *file,
                           const char *field) {
  char context[768];
  snprintf(context, sizeof context, "%s: %s", file, field);
  if (read_config_file(err, file, field, context, "token file", kc->token_file, COZY_MAX_TOKEN_BYTES,
                       &kc->token) < 0)
    return -1;
  cozy_blob_rtrim(&kc->token);
  snprintf(context, sizeof context, "%s: %s: token file %s", file, field, kc->token_file);
  return check_token(err, file, field, context, &kc->token);
}

/* get_str for a key that must be there: 1 with *v, or -1 (missing: failed). */
static int get_required(struct loader *ld, struct kfile *f, yaml_node_t *map, const char *key,
                        const char *where, const char **v) {
  char field[256];
  int r = get_str(ld, f, map, key, where, v);
  if (r != 0) return r < 0 ? -1 : 1;
  join(field, sizeof field, where, key);
  return fail(ld->err, f->path, field, "%s: %s is missing", f->path, field);
}

/* The context `want` names, else current-context of the first file that
** sets it: its namespace, cluster and user (names) into kc. */
static int from_context(struct loader *ld, const char *want, struct cozy_kubeconfig *kc) {
  struct cozy_config_error *err = ld->err;
  const char *ctxname = want, *v;
  const char *first = ld->files[0].path;
  char where[256];
  yaml_node_t *ctx = NULL;
  struct kfile *f;
  int i, r;
  if (ctxname == NULL || *ctxname == '\0') {
    ctxname = NULL;
    for (i = 0; i < ld->nfiles && ctxname == NULL; i++) {
      f = &ld->files[i];
      r = get_str(ld, f, yaml_document_get_root_node(&f->doc), "current-context", "", &v);
      if (r < 0) return -1;
      if (r == 1 && *v) ctxname = v;
    }
    if (ctxname == NULL)
      return fail(err, first, "current-context", "%s: current-context is not set and no --context was given",
                  first);
  }
  if (dup_to(err, first, &kc->context, ctxname) < 0) return -1;
  f = find_named(ld, "contexts", "context", ctxname, &ctx);
  if (f == NULL || ctx == NULL || ctx->type != YAML_MAPPING_NODE)
    return fail(err, first, want ? "--context" : "current-context",
                "%s: context \"%s\" not found in contexts", first, ctxname);
  snprintf(where, sizeof where, "contexts[%s].context", ctxname);
  if ((r = get_str(ld, f, ctx, "namespace", where, &v)) < 0) return -1;
  if (r == 1 && *v && dup_to(err, f->path, &kc->namespace, v) < 0) return -1;
  if (get_required(ld, f, ctx, "cluster", where, &v) < 0) return -1;
  if (dup_to(err, f->path, &kc->cluster, v) < 0) return -1;
  if ((r = get_str(ld, f, ctx, "user", where, &v)) < 0) return -1;
  if (r == 1 && dup_to(err, f->path, &kc->user, v) < 0) return -1;
  return 0;
}

/* tls-server-name (the name the server's certificate is checked against
** and sent as SNI) and proxy-url (http, https or socks5, as client-go
** allows: it replaces the proxy the environment names) into kc. */
static int cluster_routing(struct loader *ld, struct kfile *f, yaml_node_t *cl, const char *where,
                           struct cozy_kubeconfig *kc) {
  struct cozy_config_error *err = ld->err;
  char field[256];
  const char *v;
  int r;
  if ((r = get_str(ld, f, cl, "tls-server-name", where, &v)) < 0) return -1;
  if (r == 1 && *v) {
    join(field, sizeof field, where, "tls-server-name");
    if (strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != strlen(v))
      return fail(err, f->path, field, "%s: %s must be a DNS name", f->path, field);
    if (dup_to(err, f->path, &kc->tls_server_name, v) < 0) return -1;
  }
  if ((r = get_str(ld, f, cl, "proxy-url", where, &v)) < 0) return -1;
  if (r == 1 && *v) {
    join(field, sizeof field, where, "proxy-url");
    if (strncmp(v, "http://", 7) != 0 && strncmp(v, "https://", 8) != 0 && strncmp(v, "socks5://", 9) != 0)
      return fail(err, f->path, field, "%s: %s must be an http://, https:// or socks5:// URL", f->path,
                  field);
    {
      size_t i;
      for (i = 0; v[i]; i++)
        if ((unsigned char)v[i] <= 0x20 || v[i] == 0x7f)
          return fail(err, f->path, field, "%s: %s contains a space or a control character", f->path, field);
    }
    if (dup_to(err, f->path, &kc->proxy_url, v) < 0) return -1;
  }
  return 0;
}

/* The context's cluster: server, TLS verification and CA into kc. */
static int from_cluster(struct loader *ld, struct cozy_kubeconfig *kc) {
  struct cozy_config_error *err = ld->err;
  const char *first = ld->files[0].path, *v;
  char where[256], field[256];
  yaml_node_t *cl = NULL, *n;
  struct kfile *f = find_named(ld, "clusters", "cluster", kc->cluster, &cl);
  snprintf(where, sizeof where, "clusters[%s].cluster", kc->cluster);
  if (f == NULL || cl == NULL || cl->type != YAML_MAPPING_NODE)
    return fail(err, first, where, "%s: cluster \"%s\" (of context \"%s\") not found in clusters", first,
                kc->cluster, kc->context);
  if (get_required(ld, f, cl, "server", where, &v) < 0) return -1;
  join(field, sizeof field, where, "server");
  if (strncmp(v, "https://", 8) != 0 && strncmp(v, "http://", 7) != 0)
    return fail(err, f->path, field, "%s: %s must be an http:// or https:// URL", f->path, field);
  if (dup_to(err, f->path, &kc->server, v) < 0) return -1;
  while (strlen(kc->server) > 8 && kc->server[strlen(kc->server) - 1] == '/')
    kc->server[strlen(kc->server) - 1] = '\0';
  n = cozy_yaml_get(&f->doc, cl, "insecure-skip-tls-verify");
  if (!is_null(n)) {
    const char *b = n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "";
    join(field, sizeof field, where, "insecure-skip-tls-verify");
    if (strcasecmp(b, "true") == 0) kc->insecure = 1;
    else if (strcasecmp(b, "false") != 0)
      return fail(err, f->path, field, "%s: %s must be true or false", f->path, field);
  }
  if (get_blob(ld, f, cl, "certificate-authority", where, &kc->ca) < 0) return -1;
  return cluster_routing(ld, f, cl, where, kc);
}

/* Fails when the user sets a kind of authentication cozy-migrate refuses:
** auth-provider (client-go dropped its gcp and azure providers in 1.26;
** each has an exec plugin in its place) and basic authentication. */
static int refuse_plugins(struct loader *ld, struct kfile *f, yaml_node_t *us, const char *where) {
  char field[256];
  if (!is_null(cozy_yaml_get(&f->doc, us, "auth-provider"))) {
    join(field, sizeof field, where, "auth-provider");
    return fail(ld->err, f->path, field,
                "%s: %s: auth-provider plugins are not supported (client-go removed them); use the "
                "exec plugin that replaces yours: gke-gcloud-auth-plugin (gcp), kubelogin (azure, "
                "and OIDC as kubectl oidc-login), or your provider's",
                f->path, field);
  }
  if (!is_null(cozy_yaml_get(&f->doc, us, "username")) || !is_null(cozy_yaml_get(&f->doc, us, "password"))) {
    join(field, sizeof field, where, "username");
    return fail(ld->err, f->path, field, "%s: %s: basic authentication is not supported", f->path, field);
  }
  return 0;
}

/* A NULL-terminated copy of a YAML sequence of strings (exec.args). */
static int str_list(struct loader *ld, struct kfile *f, yaml_node_t *seq, const char *field,
                    const char *first, char ***out) {
  size_t n = 1, i = 1;
  yaml_node_item_t *it;
  if (seq != NULL && !is_null(seq) && seq->type != YAML_SEQUENCE_NODE)
    return fail(ld->err, f->path, field, "%s: %s must be a list of strings", f->path, field);
  if (seq != NULL && seq->type == YAML_SEQUENCE_NODE)
    n += (size_t)(seq->data.sequence.items.top - seq->data.sequence.items.start);
  *out = calloc(n + 1, sizeof **out);
  if (*out == NULL || ((*out)[0] = strdup(first)) == NULL)
    return fail(ld->err, f->path, field, "out of memory");
  if (seq == NULL || seq->type != YAML_SEQUENCE_NODE) return 0;
  for (it = seq->data.sequence.items.start; it < seq->data.sequence.items.top; it++, i++) {
    yaml_node_t *e = yaml_document_get_node(&f->doc, *it);
    if (e == NULL || e->type != YAML_SCALAR_NODE)
      return fail(ld->err, f->path, field, "%s: %s must be a list of strings", f->path, field);
    if (((*out)[i] = strdup((const char *)e->data.scalar.value)) == NULL)
      return fail(ld->err, f->path, field, "out of memory");
  }
  return 0;
}

/* exec.env: a list of { name, value } into "NAME=VALUE" strings. */
static int env_list(struct loader *ld, struct kfile *f, yaml_node_t *seq, const char *where, char ***out) {
  char field[256];
  size_t n = 0, i = 0;
  yaml_node_item_t *it;
  join(field, sizeof field, where, "env");
  if (seq != NULL && !is_null(seq) && seq->type != YAML_SEQUENCE_NODE)
    return fail(ld->err, f->path, field, "%s: %s must be a list of {name, value}", f->path, field);
  if (seq != NULL && seq->type == YAML_SEQUENCE_NODE)
    n = (size_t)(seq->data.sequence.items.top - seq->data.sequence.items.start);
  *out = calloc(n + 1, sizeof **out);
  if (*out == NULL) return fail(ld->err, f->path, field, "out of memory");
  if (n == 0) return 0;
  for (it = seq->data.sequence.items.start; it < seq->data.sequence.items.top; it++, i++) {
    yaml_node_t *e = yaml_document_get_node(&f->doc, *it);
    const char *name = NULL, *value = "";
    size_t len;
    if (get_str(ld, f, e, "name", field, &name) < 0 || get_str(ld, f, e, "value", field, &value) < 0)
      return -1;
    if (name == NULL || *name == '\0' || strchr(name, '=') != NULL)
      return fail(ld->err, f->path, field, "%s: %s[%zu].name must be set, without '='", f->path, field, i);
    len = strlen(name) + strlen(value) + 2;
    if (((*out)[i] = malloc(len)) == NULL) return fail(ld->err, f->path, field, "out of memory");
    snprintf((*out)[i], len, "%s=%s", name, value);
  }
  return 0;
}

/* users[].user.exec into kc->exec, checked as client-go's validation does. */
static int user_exec(struct loader *ld, struct kfile *f, yaml_node_t *us, const char *where,
                     struct cozy_kubeconfig *kc) {
  struct cozy_config_error *err = ld->err;
  yaml_node_t *ex = cozy_yaml_get(&f->doc, us, "exec"), *n;
  struct cozy_exec *e;
  char w[256], field[256];
  const char *v;
  int r;
  if (is_null(ex)) return 0;
  join(w, sizeof w, where, "exec");
  if (ex->type != YAML_MAPPING_NODE) return fail(err, f->path, w, "%s: %s must be a mapping", f->path, w);
  if ((e = kc->exec = calloc(1, sizeof *e)) == NULL) return fail(err, f->path, w, "out of memory");
  e->timeout = COZY_EXEC_TIMEOUT_DEFAULT;
  if (dup_to(err, f->path, &e->file, f->path) < 0 || dup_to(err, f->path, &e->field, w) < 0) return -1;
  if (get_required(ld, f, ex, "command", w, &v) < 0) return -1;
  if (dup_to(err, f->path, &e->command, v) < 0) return -1;
  if (strchr(v, '/') != NULL && (e->path = resolve_path(f, v)) == NULL)
    return fail(err, f->path, w, "out of memory");
  if (get_required(ld, f, ex, "apiVersion", w, &v) < 0) return -1;
  join(field, sizeof field, w, "apiVersion");
  if (strcmp(v, "client.authentication.k8s.io/v1") != 0 &&
      strcmp(v, "client.authentication.k8s.io/v1beta1") != 0)
    return fail(err, f->path, field,
                "%s: %s must be client.authentication.k8s.io/v1 or v1beta1 (v1alpha1 was removed in "
                "Kubernetes 1.24)",
                f->path, field);
  if (dup_to(err, f->path, &e->api_version, v) < 0) return -1;
  join(field, sizeof field, w, "args");
  if (str_list(ld, f, cozy_yaml_get(&f->doc, ex, "args"), field, e->command, &e->argv) < 0) return -1;
  if (env_list(ld, f, cozy_yaml_get(&f->doc, ex, "env"), w, &e->env) < 0) return -1;
  if ((r = get_str(ld, f, ex, "installHint", w, &v)) < 0) return -1;
  if (r == 1 && *v && dup_to(err, f->path, &e->install_hint, v) < 0) return -1;
  join(field, sizeof field, w, "interactiveMode");
  if ((r = get_str(ld, f, ex, "interactiveMode", w, &v)) < 0) return -1;
  if (r == 0 || !*v) {
    /* client-go: required in v1, IfAvailable in v1beta1 */
    if (strcmp(e->api_version, "client.authentication.k8s.io/v1") == 0)
      return fail(err, f->path, field, "%s: %s must be specified for client.authentication.k8s.io/v1",
                  f->path, field);
    e->interactive_mode = COZY_EXEC_IF_AVAILABLE;
  } else if (strcmp(v, "Never") == 0) e->interactive_mode = COZY_EXEC_NEVER;
  else if (strcmp(v, "IfAvailable") == 0) e->interactive_mode = COZY_EXEC_IF_AVAILABLE;
  else if (strcmp(v, "Always") == 0) e->interactive_mode = COZY_EXEC_ALWAYS;
  else return fail(err, f->path, field, "%s: %s must be Never, IfAvailable or Always", f->path, field);
  n = cozy_yaml_get(&f->doc, ex, "provideClusterInfo");
  if (!is_null(n)) {
    const char *b = n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "";
    join(field, sizeof field, w, "provideClusterInfo");
    if (strcasecmp(b, "true") == 0) e->provide_cluster_info = 1;
    else if (strcasecmp(b, "false") != 0)
      return fail(err, f->path, field, "%s: %s must be true or false", f->path, field);
  }
  return 0;
}

/* The user's token (`token`, then `tokenFile`, which takes precedence as in
** client-go) into kc. */
static int user_token(struct loader *ld, struct kfile *f, yaml_node_t *us, const char *where,
                      struct cozy_kubeconfig *kc) {
  struct cozy_config_error *err = ld->err;
  char field[256];
  const char *v;
  int r;
  if ((r = get_str(ld, f, us, "token", where, &v)) < 0) return -1;
  if (r == 1 && *v) {
    /* the scalar's own length: a "\0" escape must not cut the token short */
    struct cozy_blob raw;
    char context[768];
    raw.data = (char *)v;
    raw.len = cozy_yaml_get(&f->doc, us, "token")->data.scalar.length;
    join(field, sizeof field, where, "token");
    snprintf(context, sizeof context, "%s: %s", f->path, field);
    if (check_token(err, f->path, field, context, &raw) < 0) return -1;
    if (dup_to(err, f->path, &kc->token.data, v) < 0) return -1;
    kc->token.len = raw.len;
  }
  if ((r = get_str(ld, f, us, "tokenFile", where, &v)) < 0) return -1;
  if (r == 0 || !*v) return 0;
  kc->token_file = resolve_path(f, v);
  cozy_blob_free(&kc->token);
  join(field, sizeof field, where, "tokenFile");
  if (kc->token_file == NULL) return fail(err, f->path, field, "%s: out of memory", f->path);
  return load_token_file(kc, err, f->path, field);
}

/* A value that goes into an Impersonate-* header: control characters (CR
** and LF would end the header and start another) are refused. */
static int header_value(struct loader *ld, struct kfile *f, const char *field, const char *v, size_t len) {
  size_t i;
  for (i = 0; i < len; i++) {
    unsigned char c = (unsigned char)v[i];
    if (c < 0x20 || c == 0x7f)
      return fail(ld->err, f->path, field,
                  "%s: %s contains a control character; it cannot be sent in an impersonation header",
                  f->path, field);
  }
  return 0;
}

/* The length of scalar `key` of mapping `map`, its own: a "\0" escape
** must not cut a value short (get_str returned it as present). */
static size_t scalar_len(struct kfile *f, yaml_node_t *map, const char *key) {
  return cozy_yaml_get(&f->doc, map, key)->data.scalar.length;
}

/* Appends s (copied) to the NULL-terminated *v of *n entries. */
static int push(char ***v, size_t *n, const char *s) {
  char **grown = realloc(*v, (*n + 2) * sizeof **v);
  if (grown == NULL) return -1;
  *v = grown;
  if ((grown[*n] = strdup(s)) == NULL) return -1;
  grown[++*n] = NULL;
  return 0;
}

/* A YAML sequence of strings, each appended to *v (key, then the value,
** when key is not NULL: as-user-extra's pairs); field names it in errors. */
static int header_values(struct loader *ld, struct kfile *f, yaml_node_t *seq, const char *field,
                         const char *key, char ***v, size_t *n) {
  yaml_node_item_t *it;
  if (is_null(seq)) return 0;
  if (seq->type != YAML_SEQUENCE_NODE)
    return fail(ld->err, f->path, field, "%s: %s must be a list of strings", f->path, field);
  for (it = seq->data.sequence.items.start; it < seq->data.sequence.items.top; it++) {
    yaml_node_t *e = yaml_document_get_node(&f->doc, *it);
    const char *s;
    if (e == NULL || e->type != YAML_SCALAR_NODE)
      return fail(ld->err, f->path, field, "%s: %s must be a list of strings", f->path, field);
    s = (const char *)e->data.scalar.value;
    if (header_value(ld, f, field, s, e->data.scalar.length) < 0) return -1;
    if ((key != NULL && push(v, n, key) < 0) || push(v, n, s) < 0)
      return fail(ld->err, f->path, field, "out of memory");
  }
  return 0;
}

/* The user's impersonation (as, as-uid, as-groups, as-user-extra) into kc,
** as client-go reads it (clientcmd's AuthInfo) and validates it: uid,
** groups or extra without a user is an error, never ignored. */
static int user_impersonation(struct loader *ld, struct kfile *f, yaml_node_t *us, const char *where,
                              struct cozy_kubeconfig *kc) {
  struct cozy_config_error *err = ld->err;
  yaml_node_t *extra = cozy_yaml_get(&f->doc, us, "as-user-extra");
  yaml_node_pair_t *pair;
  char field[256];
  const char *v;
  size_t ngroups = 0, nextra = 0;
  int r;
  join(field, sizeof field, where, "as");
  if ((r = get_str(ld, f, us, "as", where, &v)) < 0) return -1;
  if (r == 1 && *v &&
      (header_value(ld, f, field, v, scalar_len(f, us, "as")) < 0 ||
       dup_to(err, f->path, &kc->as_user, v) < 0))
    return -1;
  join(field, sizeof field, where, "as-uid");
  if ((r = get_str(ld, f, us, "as-uid", where, &v)) < 0) return -1;
  if (r == 1 && *v &&
      (header_value(ld, f, field, v, scalar_len(f, us, "as-uid")) < 0 ||
       dup_to(err, f->path, &kc->as_uid, v) < 0))
    return -1;
  join(field, sizeof field, where, "as-groups");
  if (header_values(ld, f, cozy_yaml_get(&f->doc, us, "as-groups"), field, NULL, &kc->as_groups, &ngroups) <
      0)
    return -1;
  join(field, sizeof field, where, "as-user-extra");
  if (!is_null(extra) && extra->type != YAML_MAPPING_NODE)
    return fail(err, f->path, field, "%s: %s must be a mapping of keys to lists of strings", f->path, field);
  for (pair = is_null(extra) ? NULL : extra->data.mapping.pairs.start;
       pair != NULL && pair < extra->data.mapping.pairs.top; pair++) {
    yaml_node_t *k = yaml_document_get_node(&f->doc, pair->key);
    char kfield[512];
    if (k == NULL || k->type != YAML_SCALAR_NODE || k->data.scalar.length == 0 ||
        strlen((const char *)k->data.scalar.value) != k->data.scalar.length)
      return fail(err, f->path, field, "%s: %s must be a mapping of keys to lists of strings", f->path,
                  field);
    if (snprintf(kfield, sizeof kfield, "%s.%s", field, (const char *)k->data.scalar.value) >=
        (int)sizeof kfield)
      kfield[sizeof kfield - 1] = '\0';
    if (header_values(ld, f, yaml_document_get_node(&f->doc, pair->value), kfield,
                      (const char *)k->data.scalar.value, &kc->as_extra, &nextra) < 0)
      return -1;
  }
  if (kc->as_user == NULL && (kc->as_uid != NULL || ngroups > 0 || nextra > 0)) {
    join(field, sizeof field, where, kc->as_uid ? "as-uid" : ngroups ? "as-groups" : "as-user-extra");
    return fail(err, f->path, field,
                "%s: %s: requesting uid, groups or user-extra for user \"%s\" without impersonating a user "
                "(set %s.as)",
                f->path, field, kc->user, where);
  }
  return 0;
}

/* The context's user (none: anonymous): its client certificate and token. */
static int from_user(struct loader *ld, struct cozy_kubeconfig *kc) {
  struct cozy_config_error *err = ld->err;
  const char *first = ld->files[0].path;
  char where[256], field[256];
  yaml_node_t *us = NULL;
  struct kfile *f;
  if (kc->user == NULL) return 0;
  f = find_named(ld, "users", "user", kc->user, &us);
  snprintf(where, sizeof where, "users[%s].user", kc->user);
  if (f == NULL)
    return fail(err, first, where, "%s: user \"%s\" (of context \"%s\") not found in users", first, kc->user,
                kc->context);
  if (us == NULL || is_null(us)) return 0;
  if (us->type != YAML_MAPPING_NODE)
    return fail(err, f->path, where, "%s: %s must be a mapping", f->path, where);
  if (refuse_plugins(ld, f, us, where) < 0 || user_impersonation(ld, f, us, where, kc) < 0) return -1;
  if (get_blob(ld, f, us, "client-certificate", where, &kc->cert) < 0) return -1;
  if (get_blob(ld, f, us, "client-key", where, &kc->key) < 0) return -1;
  if ((kc->cert.data == NULL) != (kc->key.data == NULL)) {
    join(field, sizeof field, where, kc->cert.data ? "client-key" : "client-certificate");
    return fail(err, f->path, field, "%s: %s is missing (a client certificate needs its key)", f->path,
                field);
  }
  if (user_exec(ld, f, us, where, kc) < 0 || user_token(ld, f, us, where, kc) < 0) return -1;
  if (kc->exec && (kc->token.data || kc->token_file || kc->cert.data)) {
    /* client-go: a token or a client certificate the kubeconfig gives is
    ** used, and the plugin never runs (exec.go, UpdateTransportConfig) */
    cozy_exec_free(kc->exec);
    kc->exec = NULL;
  }
  return 0;
}

/* The selected context, cluster and user, from the loaded files. */
static int from_kubeconfig(struct loader *ld, const char *want, struct cozy_kubeconfig *kc) {
  if (from_context(ld, want, kc) < 0 || from_cluster(ld, kc) < 0) return -1;
  return from_user(ld, kc);
}

static char *sa_path(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int in_cluster(struct cozy_kubeconfig *kc, struct cozy_config_error *err) {
  const char *host = getenv("KUBERNETES_SERVICE_HOST");
  const char *port = getenv("KUBERNETES_SERVICE_PORT");
  const char *dir = getenv(COZY_SA_DIR_ENV);
  char *p;
  size_t n;
  struct cozy_blob ns = {NULL, 0};
  if (dir == NULL || *dir == '\0') dir = COZY_SA_DIR_DEFAULT;
  if (port == NULL || *port == '\0')
    return fail(
        err, "KUBERNETES_SERVICE_PORT", "KUBERNETES_SERVICE_PORT",
        "in-cluster configuration: KUBERNETES_SERVICE_HOST is set but KUBERNETES_SERVICE_PORT is not");
  if (dup_to(err, "in-cluster", &kc->source, "in-cluster") < 0) return -1;
  n = strlen(host) + strlen(port) + 16;
  kc->server = malloc(n);
  if (kc->server == NULL) return fail(err, "in-cluster", "", "in-cluster: out of memory");
  if (strchr(host, ':') != NULL && host[0] != '[') /* IPv6 literal */
    snprintf(kc->server, n, "https://[%s]:%s", host, port);
  else snprintf(kc->server, n, "https://%s:%s", host, port);
  kc->token_file = sa_path(dir, "token");
  if (kc->token_file == NULL) return fail(err, "in-cluster", "", "in-cluster: out of memory");
  if (read_config_file(err, kc->token_file, "token", "in-cluster configuration", "token file", kc->token_file,
                       COZY_MAX_TOKEN_BYTES, &kc->token) < 0)
    return -1;
  cozy_blob_rtrim(&kc->token);
  if (check_token(err, kc->token_file, "token", "in-cluster configuration", &kc->token) < 0) return -1;
  p = sa_path(dir, "ca.crt");
  if (p == NULL) return fail(err, "in-cluster", "", "in-cluster: out of memory");
  if (read_config_file(err, p, "ca.crt", "in-cluster configuration", "CA file", p, COZY_MAX_PEM_BYTES,
                       &kc->ca) < 0) {
    free(p);
    return -1;
  }
  free(p);
  p = sa_path(dir, "namespace");
  if (p == NULL) return fail(err, "in-cluster", "", "in-cluster: out of memory");
  if (cozy_read_file(p, 4096, &ns) == 0) { /* a namespace name is at most 63 bytes */
    int bad = 0;
    cozy_blob_rtrim(&ns);
    if (ns.len > 0) bad = dup_to(err, p, &kc->namespace, ns.data);
    cozy_blob_free(&ns);
    if (bad) {
      free(p);
      return -1;
    }
  }
  free(p);
  return 0;
}

int cozy_kubeconfig_load(const char *path, const char *context, struct cozy_kubeconfig *kc,
                         struct cozy_config_error *err) {
  struct loader ld;
  const char *env = getenv("KUBECONFIG");
  int rc = 0;
  memset(kc, 0, sizeof *kc);
  memset(&ld, 0, sizeof ld);
  memset(err, 0, sizeof *err);
  ld.err = err;
  if (path != NULL && *path != '\0') {
    rc = load_file(&ld, path, 1);
    if (rc == 0) rc = dup_to(err, path, &kc->source, path);
  } else if (env != NULL && *env != '\0') {
    /* missing files in the list are skipped, as kubectl does */
    char *list = strdup(env), *save = NULL, *p;
    if (list == NULL) rc = fail(err, "KUBECONFIG", "KUBECONFIG", "KUBECONFIG: out of memory");
    for (p = list ? strtok_r(list, ":", &save) : NULL; p && rc == 0; p = strtok_r(NULL, ":", &save))
      if (*p) rc = load_file(&ld, p, 0);
    free(list);
    if (rc == 0 && ld.nfiles == 0)
      rc = fail(err, env, "KUBECONFIG", "no file named in KUBECONFIG exists (%s)", env);
    if (rc == 0) rc = dup_to(err, "KUBECONFIG", &kc->source, env);
  } else {
    /* client-go: ~/.kube/config when it exists, else in-cluster */
    const char *home = getenv("HOME");
    const char *svc = getenv("KUBERNETES_SERVICE_HOST");
    char def[1024];
    snprintf(def, sizeof def, "%s/.kube/config", home ? home : "");
    rc = load_file(&ld, def, 0);
    if (rc == 0 && ld.nfiles == 0) {
      if (svc != NULL && *svc != '\0') {
        rc = in_cluster(kc, err);
        if (rc != 0) cozy_kubeconfig_free(kc);
        return rc;
      }
      rc = fail(err, def, "",
                "no cluster configuration: no --kubeconfig, no KUBECONFIG, %s does not exist, and "
                "not in a cluster (KUBERNETES_SERVICE_HOST unset)",
                def);
    }
    if (rc == 0) rc = dup_to(err, def, &kc->source, def);
  }
  if (rc == 0) rc = from_kubeconfig(&ld, context, kc);
  loader_free(&ld);
  if (rc != 0) cozy_kubeconfig_free(kc);
  return rc;
}
