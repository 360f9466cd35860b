-- Migration 50: adopt the legacy etcd.aenix.io EtcdClusters onto the new
-- etcd-operator.cozystack.io/v1alpha2 operator, in place, with etcd-migrate. Port of
-- the platform's script 50 (docs/migrations/50-etcd-adopt.md says what it does and
-- every difference from the shell). In order: warn about legacy backup schedules
-- (they do not carry over); apply the v1alpha2 CRDs the image ships if absent;
-- resolve the pre-adoption snapshot target (or take the ETCD_ADOPT_SKIP_BACKUP
-- hatch); add the native and legacy wildcard SANs to each cluster's server and peer
-- Certificates and wait for cert-manager to re-issue them; etcd-migrate's dry run;
-- stage the snapshot credentials into each adopted namespace; the operator scaled to
-- 0, `etcd-migrate --apply`, the operator scaled back to 1 (by `finally`, however the
-- step ends). Fails closed: any failure leaves the version, and the next upgrade
-- reruns it (etcd-migrate completes a partial adoption).
local base64 = require "cozy.base64"
local obj = require "cozy.obj"
local rule = require "cozy.rule"

local OPERATOR_NS, OPERATOR = "cozy-etcd-operator", "etcd-operator-controller-manager"
local V2_CRD = "etcdclusters.etcd-operator.cozystack.io"
local STRATEGY, CREDS, CREDS_NS = "cozy-default-etcd", "cozy-backups-creds", "cozy-velero"
local SNAPSHOT_KEY_PREFIX = "cozy-system/etcd-adoption/"
local MANAGED_BY = "apps.cozystack.io/managed-by"
local TENANT_LABEL = "internal.cozystack.io/tenantresource"
local TRUE = { ["1"] = true, ["true"] = true, yes = true }
local HATCH = "kubectl edit package.cozystack.io cozystack.cozystack-platform and set "
  .. "spec.components.platform.values.migrations.etcdAdoptSkipBackup: true (adopts every "
  .. "legacy etcd WITHOUT a snapshot; set it back to false after)"

-- The operator was scaled down by this step: finally scales it back up (the
-- shell's EXIT trap is armed at the scale-down, not before).
local operator_down = false

local function scale_operator(ctx, s, replicas, timeout, timed_out)
  ctx.log:change("%s/%s: {scaled|would scale} to %d", OPERATOR_NS, OPERATOR, replicas)
  local ref = { metadata = { namespace = OPERATOR_NS, name = OPERATOR } }
  if not s.operator:merge_patch(ref, { spec = { replicas = replicas } }) then
    error(("Deployment %s/%s not found: the operator to scale"):format(OPERATOR_NS, OPERATOR))
  end
  if timeout then
    s.operator:wait(OPERATOR, { namespace = OPERATOR_NS, condition = rule.conditions.rolled_out,
      timeout = timeout, timed_out = timed_out })
  end
end

local function warn_orphaned_backup_schedules(ctx, s)
  local found = {}
  s.backups:each(function(o) found[#found + 1] = obj.key(o) end)
  if #found == 0 then return end
  ctx.log:warn("legacy etcd.aenix.io backup resources will NOT be migrated: scheduled etcd "
    .. "backups stop after this upgrade; reconfigure them as a backups.cozystack.io "
    .. "BackupClass + Plan (examples/backups/etcd): " .. table.concat(found, ", "))
end

-- The v1alpha2 CRDs the image ships (JSON files in ETCD_CRD_DIR), applied when absent.
local function ensure_v1alpha2_crds(ctx, s)
  if s.crds:get(V2_CRD) then return ctx.log:info("v1alpha2 CRDs already present") end
  if ctx.files:exists("crds") ~= "directory" then
    error(("v1alpha2 CRDs are absent and the baked copy %s is missing from the image")
      :format(ctx.params.ETCD_CRD_DIR))
  end
  for _, file in ipairs(ctx.files:list("crds", ".json")) do
    local crd = ctx.files:json("crds", file)
    s.crds:apply(crd, { field_manager = "kubectl", force = true })
    ctx.log:change("CRD %s: {applied|would apply} from %s", crd.metadata.name, file)
  end
  s.crds:wait(V2_CRD, { condition = rule.conditions.established, timeout = 60 })
end

local function secret_value(secret, key)
  local v = obj.get(secret, { "data", key })
  return v and (base64.decode(v):gsub("%s", "")) or ""
end

-- Is bucket claimed by a live BucketClaim (COSI-provisioned)? A bucket claimed only
-- by a terminating claim cannot be classified: refused, as the shell refuses it.
local function cosi_bucket_claimed(s, bucket)
  local live, terminating = false, false
  s.claims:each(function(c)
    if obj.get(c, "status.bucketName") ~= bucket then return end
    if c.metadata.deletionTimestamp then terminating = true else live = true end
  end)
  if terminating and not live then
    error(("bucket '%s' is claimed ONLY by a TERMINATING BucketClaim: cannot tell a COSI "
      .. "bucket mid-teardown from an external store that reuses the name; resolve the "
      .. "claim, then re-run"):format(bucket))
  end
  return live
end

-- The snapshot coordinates from the projected credentials Secret when a
-- BucketClaim claims its bucket (endpoint forced to https), else none.
local function secret_coordinates(ctx, s, creds)
  local c = { ep = secret_value(creds, "endpoint"), bucket = secret_value(creds, "bucketName"),
    region = secret_value(creds, "region"), fps = secret_value(creds, "forcePathStyle") }
  if c.bucket ~= "" and cosi_bucket_claimed(s, c.bucket) then
    ctx.log:info(("bucket '%s' is claimed by a BucketClaim: COSI-provisioned, forcing https")
      :format(c.bucket))
    if c.ep ~= "" then c.ep = "https://" .. c.ep:gsub("^https?://", "") end
    return c
  end
  ctx.log:info(("no BucketClaim claims bucket '%s': treating as external S3, taking every "
    .. "coordinate from the '%s' Strategy CR"):format(c.bucket, STRATEGY))
  return { ep = "", bucket = "", region = "", fps = "" }
end

-- etcd-migrate's --backup-s3-* flags for the platform-managed snapshot: the
-- Secret's coordinates, the Strategy CR filling what the Secret lacks.
local function backup_args(ctx, s)
  local creds, c = s.secrets:get(CREDS, CREDS_NS), {}
  if creds and secret_value(creds, "AWS_ACCESS_KEY_ID") ~= ""
    and secret_value(creds, "AWS_SECRET_ACCESS_KEY") ~= "" then
    c = secret_coordinates(ctx, s, creds)
    local cr = s.strategies:served() and s.strategies:get(STRATEGY)
    local s3 = cr and obj.get(cr, "spec.template.destination.s3") or {}
    for key, field in pairs { ep = "endpoint", bucket = "bucket", region = "region",
      fps = "forcePathStyle" } do
      if c[key] == "" and s3[field] ~= nil then c[key] = tostring(s3[field]) end
    end
  end
  if (c.ep or "") == "" or (c.bucket or "") == "" then
    error(("refusing to adopt live etcd without a safety snapshot: could not resolve the "
      .. "platform backup target (the '%s' strategy and a projected '%s' Secret with "
      .. "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in '%s'). If this cluster intentionally "
      .. "has no backup storage: %s"):format(STRATEGY, CREDS, CREDS_NS, HATCH))
  end
  local args = { "--backup-s3-endpoint=" .. c.ep, "--backup-s3-bucket=" .. c.bucket,
    "--backup-s3-credentials-secret=" .. CREDS, "--backup-s3-key=" .. SNAPSHOT_KEY_PREFIX }
  if c.region ~= "" then args[#args + 1] = "--backup-s3-region=" .. c.region end
  if c.fps == "true" then args[#args + 1] = "--backup-s3-force-path-style" end
  return args
end

local function reissue_seconds(ctx)
  local n = math.tointeger(tonumber(ctx.params.ETCD_CERT_REISSUE_SECONDS))
  if n == nil or n < 1 then
    error("ETCD_CERT_REISSUE_SECONDS must be a whole number of seconds, not "
      .. ctx.params.ETCD_CERT_REISSUE_SECONDS)
  end
  return n
end

local function has(list, name)
  for _, v in ipairs(list) do if v == name then return true end end
  return false
end

-- dnsNames plus the native and legacy headless wildcards, sorted, each once
local function with_wildcards(names, native, headless)
  local merged, seen = {}, {}
  for _, n in ipairs { native, headless, table.unpack(names) } do
    if not seen[n] then seen[n], merged[#merged + 1] = true, n end
  end
  table.sort(merged)
  return merged
end

-- The server and peer Certificates of cluster ns/name get the native and the
-- legacy wildcard SANs, and the step waits for cert-manager to re-issue them.
local function ensure_wildcard_sans(ctx, s, ns, name, timeout)
  local native = ("*.%s.%s.svc"):format(name, ns)
  for _, cert_name in ipairs { name .. "-server", name .. "-peer" } do
    local cert, secret = s.certs:get(cert_name, ns), s.secrets:get(cert_name .. "-tls", ns)
    local issued = obj.get(secret or {}, { "metadata", "annotations", "cert-manager.io/alt-names" })
      or ""
    local names = obj.list(cert or {}, "spec.dnsNames")
    if cert == nil then
      ctx.log:info(("%s/%s: Certificate not found; skipping"):format(ns, cert_name))
    elseif has(names, native) or ("," .. issued .. ","):find("," .. native .. ",", 1, true) then
      ctx.log:info(("%s/%s: native wildcard already present; nothing to do"):format(ns, cert_name))
    else
      local headless = ("*.%s-headless.%s.svc"):format(name, ns)
      s.certs:merge_patch(cert, { spec = { dnsNames = with_wildcards(names, native, headless) } })
      ctx.log:change("%s/%s: {adding|would add} SANs %s (+legacy headless wildcard)", ns,
        cert_name, native)
      s.secrets:wait(cert_name .. "-tls", { namespace = ns, timeout = timeout,
        condition = rule.conditions.alt_names { native } })
    end
  end
end

-- A copy of the platform's snapshot credentials in ns, for etcd-migrate's snapshot Job
-- there: projector-owned (managed-by), never promoted to a tenant's (no tenantresource).
local function stage_backup_creds(ctx, s, source, ns)
  local copy = obj.clean(source)
  copy.metadata = { name = CREDS, namespace = ns, labels = copy.metadata.labels or {} }
  copy.metadata.labels[MANAGED_BY], copy.metadata.labels[TENANT_LABEL] = "cozystack-backups", nil
  s.secrets:apply(copy, { field_manager = "kubectl", force = true })
  ctx.log:change("%s: {staged|would stage} %s", ns, CREDS)
end

-- etcd-migrate reads only the kubeconfig file named by --kubeconfig
local function etcd_migrate(ctx, extra, opts)
  local args = { "--new-controller=" .. OPERATOR_NS .. "/" .. OPERATOR, "--skip-controller-check" }
  for _, a in ipairs(extra) do args[#args + 1] = a end
  opts.kubeconfig_flag = "--kubeconfig="
  return ctx:tool("etcd-migrate", args, opts)
end

-- the skip-backup hatch's --skip-backup, or the snapshot's flags
local function snapshot_args(ctx, s)
  if not TRUE[ctx.params.ETCD_ADOPT_SKIP_BACKUP] then
    local args = backup_args(ctx, s)
    ctx.log:info("safety snapshot: " .. table.concat(args, " "))
    return args
  end
  ctx.log:warn("migrations.etcdAdoptSkipBackup is set: adopting live etcd WITHOUT a "
    .. "pre-adoption safety snapshot, by explicit operator request; reset the flag to false "
    .. "once this upgrade is through")
  return { "--skip-backup" }
end

-- staged credentials, the operator at 0, --apply, the operator back at 1
local function adopt(ctx, s, clusters, args)
  if args[1] ~= "--skip-backup" then
    local source = s.secrets:get(CREDS, CREDS_NS)
    for _, c in ipairs(clusters) do stage_backup_creds(ctx, s, source, c.metadata.namespace) end
  end
  operator_down = true
  scale_operator(ctx, s, 0, 120)
  etcd_migrate(ctx, { "--apply", "--yes", "--agent-image=" .. ctx.params.ETCD_OPERATOR_IMAGE,
    table.unpack(args) }, {})
  operator_down = false
  scale_operator(ctx, s, 1, 180, "warn") -- the shell's rollout status || true
end

return rule {
  description = "adopt the legacy etcd.aenix.io clusters onto etcd-operator.cozystack.io/v1alpha2"
    .. " (etcd-migrate)",
  parameters = {
    { name = "ETCD_ADOPT_SKIP_BACKUP", default = "0",
      allowed = { "0", "1", "false", "true", "no", "yes" },
      description = "adopt live etcd WITHOUT the pre-adoption snapshot (the chart's "
        .. "migrations.etcdAdoptSkipBackup)" },
    { name = "ETCD_CERT_REISSUE_SECONDS", default = "120",
      description = "how long to wait for cert-manager to re-issue a Certificate with the "
        .. "wildcard SANs" },
    { name = "ETCD_CRD_DIR", default = "/etcd-operator-crds",
      description = "the v1alpha2 CRDs the image ships (JSON)" },
    { name = "ETCD_OPERATOR_IMAGE", default = "ghcr.io/cozystack/etcd-operator:v0.5.2",
      description = "the v1alpha2 operator image, etcd-migrate's --agent-image" },
  },
  files = { crds = "$ETCD_CRD_DIR" },
  -- what etcd-migrate does on the cluster (the double's snapshot stand-in: configmaps)
  tools = { ["etcd-migrate"] = { "get,list,delete etcdclusters.etcd.aenix.io",
    "get,list,create,patch etcdclusters.etcd-operator.cozystack.io",
    "get,create,patch configmaps", "get secrets" } },
  select = {
    legacy = { "etcdclusters.etcd.aenix.io",
      unserved = "No etcd.aenix.io CRD present; nothing to migrate" },
    backups = { "etcdbackupschedules.etcd.aenix.io", "etcdbackups.etcd.aenix.io",
      unserved = "{resource} not served: no legacy backup resources there" },
    crds = { "customresourcedefinitions.apiextensions.k8s.io", get = true, apply = true,
      wait = true },
    certs = { "certificates.cert-manager.io", get = true, patch = true },
    secrets = { "secrets", get = true, apply = true, wait = true },
    claims = { "bucketclaims.objectstorage.k8s.io",
      unserved = "{resource} not served: no COSI bucket" },
    strategies = { "etcds.strategy.backups.cozystack.io", get = true },
    operator = { "deployments.apps", namespace = OPERATOR_NS, name = OPERATOR, patch = true,
      wait = true },
  },

  walk = function(ctx, s)
    operator_down = false
    local clusters = {}
    if not s.legacy:each(function(c) clusters[#clusters + 1] = c end) then return end
    ctx.log:info(("Found %d legacy etcd.aenix.io/EtcdCluster(s)"):format(#clusters))
    warn_orphaned_backup_schedules(ctx, s)
    if #clusters == 0 then return end
    local timeout = reissue_seconds(ctx)
    ensure_v1alpha2_crds(ctx, s)
    local args = snapshot_args(ctx, s)
    for _, c in ipairs(clusters) do
      ensure_wildcard_sans(ctx, s, c.metadata.namespace, c.metadata.name, timeout)
    end
    etcd_migrate(ctx, {}, { dry_run = true, allow_failure = true })
    if ctx.mode == "check" then
      return ctx:finding("info",
        ("would adopt %d cluster(s) with etcd-migrate --apply"):format(#clusters))
    end
    adopt(ctx, s, clusters, args)
    ctx:outcome { adopted = #clusters }
  end,

  -- the shell's EXIT trap: the operator back at 1 however the step ended after its
  -- scale-down (a success scaled it up already); not waited on: finally has 30 s
  finally = function(ctx, s)
    if not operator_down then return end
    operator_down = false
    scale_operator(ctx, s, 1, nil)
  end,
}
