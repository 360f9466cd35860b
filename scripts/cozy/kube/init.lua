-- cozy.kube: the Kubernetes client migrations and the runner use
-- (docs/engine-api.md is the contract, docs/transport.md the behaviour).
--
-- The C module cozy.transport owns configuration, TLS, auth, retries and the
-- rate limit. This module is the face of the pieces, one job each:
--   cozy.kube.client      connect, the gate, Client:call, discovery
--   cozy.kube.resource    resources: reads, writes, update/change, lists
--   cozy.kube.update      the update engine (conflicts, backoff, scheduler)
--   cozy.kube.batch       update_each
--   cozy.kube.budget      retry budgets of a call or a batch
--   cozy.kube.projection  lean objects
--   cozy.kube.pager       pagination
--   cozy.kube.request     what a request is; paths and queries
--   cozy.kube.errors, cozy.kube.patch
local client = require "cozy.kube.client"
local errors = require "cozy.kube.errors"
local patch = require "cozy.kube.patch"
local projection = require "cozy.kube.projection"
local request = require "cozy.kube.request"
local resource = require "cozy.kube.resource"

return {
  Error = errors.Error,
  is_error = errors.is_error,
  patch = patch,
  defaults = client.defaults,
  connect = client.connect,
  Client = client.Client,
  Resource = resource.Resource,
  projection = projection.new,
  prune = projection.prune,
  urlescape = request.urlescape,
}
