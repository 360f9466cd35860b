/* The HTTP transport of one client: a libcurl easy handle (connection reuse),
** its configuration, a token bucket and the bearer token. One per client,
** used by one thread at a time; nothing here is process-wide except
** curl_global_init. */
#ifndef COZY_TRANSPORT_H
#define COZY_TRANSPORT_H

#include <curl/curl.h>

#include "kubeconfig.h"
#include "watch.h"

/* A response body larger than this is refused (ResponseTooLarge) while it
** is read. The largest legitimate answer is a list page: etcd caps an object
** at 1.5 MiB (--max-request-bytes), and a 500-item page of objects averaging
** half a MiB (VMs with big cloud-init data) is 256 MiB. The process holds
** about three copies (curl's buffer, the Lua string, the decoded tables), so
** this also bounds the memory a hostile server can make us take. */
#define COZY_MAX_RESPONSE_BYTES_DEFAULT (256.0 * 1024 * 1024)

struct cozy_retry_policy {
  int max_attempts;     /* including the first */
  double max_time;      /* seconds from the first attempt; no retry starts after it */
  double base_delay;    /* first backoff without Retry-After */
  double max_delay;     /* cap of one backoff and of an honoured Retry-After */
};

struct cozy_transport {
  CURL *curl;
  char errbuf[CURL_ERROR_SIZE];
  CURLcode setopt_rc;      /* first curl_easy_setopt failure of a batch */
  struct curl_slist *headers;
  struct cozy_kubeconfig kc;
  double request_timeout;  /* seconds; 0 = none */
  double connect_timeout;
  double token_refresh;    /* re-read token_file at least this often (seconds) */
  double token_read_at;    /* monotonic time of the last read */
  struct cozy_retry_policy retry;
  /* token bucket */
  double qps, burst, tokens, refilled_at;
  /* the response being received */
  char *body;
  size_t body_len, body_cap;
  size_t max_response_bytes; /* of the body as delivered, i.e. decompressed */
  int body_too_large;        /* the write callback stopped the transfer */
  double retry_after;      /* Retry-After seconds, or -1 */
  char warnings[2048];     /* Warning header values of the answer, '\n'-separated */
  size_t warnings_len;
  unsigned int seed;       /* for jitter, per client */
  /* during a request: the calling state's watches (NULL: none), and why the
  ** progress callback aborted the transfer (COZY_GO: it did not) */
  const struct cozy_watches *watch;
  int stop;
  double stop_detail;
  int closed;
};

/* transport_http.c */
int cozy_http_init(struct cozy_transport *t);
void cozy_http_cleanup(struct cozy_transport *t);
/* One attempt. Returns the CURLcode; *status is the HTTP status (0 if none). */
CURLcode cozy_http_perform(struct cozy_transport *t, const char *method, const char *url,
                           const char *body, size_t body_len, const char *content_type,
                           double timeout, long *status);
/* libcurl's write and header callbacks (ud is the transport): they parse
** what the server sends, so fuzz/http_response.c drives them directly. */
size_t cozy_http_on_body(char *ptr, size_t size, size_t nmemb, void *ud);
size_t cozy_http_on_header(char *buf, size_t size, size_t nitems, void *ud);
/* Re-reads the token file; 0 ok (or no file), -1 on failure (old token kept). */
int cozy_http_reload_token(struct cozy_transport *t);
/* COZY_GO, or why the wait was cut short (t->watch said stop) */
int cozy_ratelimit_wait(struct cozy_transport *t, double *detail);
double cozy_monotime(void);

#endif
