#ifndef COZY_PROXY_H
#define COZY_PROXY_H

/* The proxy URL to reach `server` through, chosen from the environment as
** kubectl does (core/proxy.c), or NULL for a direct connection. The caller
** frees the result; it may hold credentials: never log it. */
char *cozy_proxy_for(const char *server);

#endif
