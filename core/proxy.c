/*
** The proxy for the API server, chosen from the environment as kubectl
** chooses it (client-go uses Go's http.ProxyFromEnvironment, i.e.
** golang.org/x/net/http/httpproxy):
** - HTTPS_PROXY (else https_proxy) for an https server, HTTP_PROXY (else
**   http_proxy) for an http one; unset or empty: no proxy. A value without
**   a scheme means http://.
** - never for "localhost" or a loopback address;
** - NO_PROXY (else no_proxy): comma-separated; "*" matches everything; an
**   IP or a CIDR matches that address or range; "name" matches name and its
**   subdomains, ".name" and "*.name" only subdomains; "entry:port" only that
**   port. Names are compared case-insensitively; name rules never match an
**   IP host.
** The decision is made once per client: its server never changes. libcurl's
** own environment handling differs (no loopback rule, other NO_PROXY
** forms), so the result is handed to it explicitly.
*/
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy.h"

static const char *env_any(const char *upper, const char *lower) {
  const char *v = getenv(upper);
  if (v == NULL || *v == '\0') v = getenv(lower);
  return (v != NULL && *v != '\0') ? v : NULL;
}

/* Splits "scheme://host[:port][/...]" into scheme length, host, port. host
** and port are written lowercased into the given buffers. Returns 0 or -1. */
static int split_url(const char *url, int *https, char *host, size_t hostsz, char *port, size_t portsz) {
  const char *p = strstr(url, "://"), *h, *end;
  size_t n;
  if (p == NULL) return -1;
  *https = (size_t)(p - url) == 5 && strncasecmp(url, "https", 5) == 0;
  h = p + 3;
  if (*h == '[') {
    end = strchr(h, ']');
    if (end == NULL) return -1;
    n = (size_t)(end - h - 1);
    if (n + 1 > hostsz) return -1;
    memcpy(host, h + 1, n);
    host[n] = '\0';
    end++;
  } else {
    end = h + strcspn(h, ":/");
    n = (size_t)(end - h);
    if (n + 1 > hostsz) return -1;
    memcpy(host, h, n);
    host[n] = '\0';
  }
  if (*end == ':') {
    const char *q = end + 1;
    n = strcspn(q, "/");
    if (n + 1 > portsz) return -1;
    memcpy(port, q, n);
    port[n] = '\0';
  } else {
    snprintf(port, portsz, "%s", *https ? "443" : "80");
  }
  for (n = 0; host[n]; n++) host[n] = (char)tolower((unsigned char)host[n]);
  return 0;
}

/* An address of either family, for comparisons. */
struct addr {
  int family;
  unsigned char b[16];
};

static int parse_addr(const char *s, struct addr *a) {
  memset(a, 0, sizeof *a);
  if (inet_pton(AF_INET, s, a->b) == 1) {
    a->family = AF_INET;
    return 1;
  }
  if (inet_pton(AF_INET6, s, a->b) == 1) {
    a->family = AF_INET6;
    return 1;
  }
  return 0;
}

static int is_loopback(const struct addr *a) {
  static const unsigned char v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  if (a->family == AF_INET) return a->b[0] == 127;
  return memcmp(a->b, v6_loopback, 16) == 0;
}

static int in_prefix(const struct addr *ip, const struct addr *net, int bits) {
  int i;
  if (ip->family != net->family) return 0;
  for (i = 0; bits > 0; i++, bits -= 8) {
    unsigned char mask = bits >= 8 ? 0xff : (unsigned char)(0xff << (8 - bits));
    if ((ip->b[i] & mask) != (net->b[i] & mask)) return 0;
  }
  return 1;
}

/* Does one NO_PROXY entry (trimmed, lowercased) match host:port? */
static int entry_matches(char *e, const char *host, const char *port, const struct addr *ip, int host_is_ip) {
  char *slash = strchr(e, '/'), *colon, *eport = NULL;
  struct addr a;
  size_t hl, el;
  if (strcmp(e, "*") == 0) return 1;
  if (slash != NULL) { /* CIDR */
    char *endp;
    long bits;
    *slash = '\0';
    bits = strtol(slash + 1, &endp, 10);
    if (*endp != '\0' || !parse_addr(e, &a) || bits < 0 || bits > (a.family == AF_INET ? 32 : 128)) return 0;
    return host_is_ip && in_prefix(ip, &a, (int)bits);
  }
  if (e[0] == '[') { /* [v6]:port or [v6] */
    char *close = strchr(e, ']');
    if (close == NULL) return 0;
    *close = '\0';
    if (close[1] == ':') eport = close + 2;
    e++;
  } else if ((colon = strrchr(e, ':')) != NULL && strchr(e, ':') == colon) {
    *colon = '\0'; /* one colon: host:port (more would be a bare IPv6 address) */
    eport = colon + 1;
  }
  if (eport != NULL && strcmp(eport, port) != 0) return 0;
  if (parse_addr(e, &a)) return host_is_ip && a.family == ip->family && memcmp(a.b, ip->b, 16) == 0;
  if (host_is_ip || *e == '\0') return 0;
  if (e[0] == '*' && e[1] == '.') e++;
  hl = strlen(host);
  el = strlen(e);
  if (e[0] == '.') /* subdomains only */
    return hl > el && strcmp(host + hl - el, e) == 0;
  if (strcmp(host, e) == 0) return 1;
  return hl > el && host[hl - el - 1] == '.' && strcmp(host + hl - el, e) == 0;
}

static int excluded(const char *host, const char *port, const struct addr *ip, int host_is_ip) {
  const char *list = env_any("NO_PROXY", "no_proxy");
  char *copy, *save = NULL, *tok;
  int hit = 0;
  if (list == NULL) return 0;
  copy = strdup(list);
  if (copy == NULL) return 0;
  for (tok = strtok_r(copy, ",", &save); tok && !hit; tok = strtok_r(NULL, ",", &save)) {
    char *s = tok, *end;
    while (isspace((unsigned char)*s)) s++;
    end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1])) *--end = '\0';
    for (end = s; *end; end++) *end = (char)tolower((unsigned char)*end);
    if (*s) hit = entry_matches(s, host, port, ip, host_is_ip);
  }
  free(copy);
  return hit;
}

char *cozy_proxy_for(const char *server) {
  char host[256], port[16];
  const char *proxy;
  struct addr ip;
  int https, host_is_ip;
  size_t n;
  char *out;
  if (server == NULL || split_url(server, &https, host, sizeof host, port, sizeof port) != 0) return NULL;
  proxy = https ? env_any("HTTPS_PROXY", "https_proxy") : env_any("HTTP_PROXY", "http_proxy");
  if (proxy == NULL) return NULL;
  host_is_ip = parse_addr(host, &ip);
  if (strcmp(host, "localhost") == 0 || (host_is_ip && is_loopback(&ip))) return NULL;
  if (excluded(host, port, &ip, host_is_ip)) return NULL;
  n = strlen(proxy) + sizeof "http://";
  out = malloc(n);
  if (out == NULL) return NULL;
  snprintf(out, n, "%s%s", strstr(proxy, "://") ? "" : "http://", proxy);
  return out;
}
