/* The engine's endpoint for a legacy script (core/endpoint.c): a
** rehearsal's overlay, or a run bound to a plan forwarding to the cluster;
** proc.spawn serves it while the script runs in its own network namespace. */
#ifndef COZY_ENDPOINT_H
#define COZY_ENDPOINT_H

#include <poll.h>

#include "lua.h"

#define COZY_ENDPOINT_MAX_CONNS 16 /* connections served at once; more are refused */

struct cozy_endpoint;

/* The endpoint at idx (raises unless it is an open one). */
struct cozy_endpoint *cozy_endpoint_check(lua_State *L, int idx);
/* The CA (PEM) and the bearer token, for the script's kubeconfig. */
const char *cozy_endpoint_ca(const struct cozy_endpoint *ep, size_t *len);
const char *cozy_endpoint_token(const struct cozy_endpoint *ep, size_t *len);
/* Takes listen_fd over (closed by detach, or by the endpoint's close). */
void cozy_endpoint_attach(struct cozy_endpoint *ep, int listen_fd);
/* Closes the listening socket and every connection. */
void cozy_endpoint_detach(struct cozy_endpoint *ep);
/* The descriptors to poll, into pfd (at most max); their count. */
int cozy_endpoint_fill(const struct cozy_endpoint *ep, struct pollfd *pfd, int max);
/* After poll: accepts, reads, and serves each complete request through the
** function at stack index serve; its first error is kept at errslot. */
void cozy_endpoint_handle(lua_State *L, struct cozy_endpoint *ep, const struct pollfd *pfd, int n, int serve,
                          int errslot);
/* Whether serve asked that the script be stopped (its fourth result). */
int cozy_endpoint_stopping(const struct cozy_endpoint *ep);

#endif
