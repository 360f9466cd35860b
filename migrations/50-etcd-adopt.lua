-- Migration 50: adopt the legacy etcd.aenix.io EtcdClusters onto the new
-- etcd-operator.cozystack.io/v1alpha2 operator, in place, with etcd-migrate. Port of
-- the platform's script 50 (docs/migrations/50-etcd-adopt.md says what it does and
-- every difference from the shell). In order: warn about legacy backup schedules
-- (they do not carry over); apply the v1alpha2 CRDs the image ships if absent; resolve
-- the pre-adoption snapshot target (or take the ETCD_ADOPT_SKIP_BACKUP hatch); add the
-- native and legacy wildcard SANs to each cluster's server and peer Certificates and
-- wait for cert-manager to re-issue them; etcd-migrate's dry run; stage the snapshot
-- credentials into each adopted namespace; the operator scaled to 0, `etcd-migrate
-- --apply`, the operator scaled back to 1 — by `finally`, however the step ends.
-- Fails closed: any failure leaves the version, and the next upgrade reruns it
-- (etcd-migrate completes a partial adoption).
local base64 = require "cozy.base64"
local obj = require "cozy.obj"

local OPERATOR_NS, OPERATOR = "cozy-etcd-operator", "etcd-operator-controller-manager"
local V2_CRD = "etcdclusters.etcd-operator.cozystack.io"
local STRATEGY, CREDS, CREDS_NS = "cozy-default-etcd", "cozy-backups-creds", "cozy-velero"
local SNAPSHOT_KEY_PREFIX = "cozy-system/etcd-adoption/"
local MANAGED_BY, TENANT_LABEL = "apps.cozystack.io/managed-by", "internal.cozystack.io/tenantresource"
local TRUE = { ["1"] = true, ["true"] = true, yes = true }

local function allow(group, resource, verbs, namespace)
  local out = {}
  for _, verb in ipairs(verbs) do out[#out + 1] = { verb = verb, group = group, resource = resource, namespace = namespace } end
  return out
end
local function permissions(...)
  local out = {}
  for _, list in ipairs { ... } do for _, p in ipairs(list) do out[#out + 1] = p end end
  return out
end

-- The operator was scaled down by this step: finally scales it back up (the shell's
-- EXIT trap is armed at the scale-down, not before).
local operator_down = false

local function deployments(ctx) return ctx.kube:resource("apps/v1", "deployments", { kind = "Deployment" }) end

local function scale_operator(ctx, replicas, timeout)
  deployments(ctx):merge_patch(OPERATOR_NS, OPERATOR, { spec = { replicas = replicas } })
  ctx.log:change("%s/%s: {scaled|would scale} to %d", OPERATOR_NS, OPERATOR, replicas)
  if timeout then deployments(ctx):wait(OPERATOR_NS, OPERATOR, { condition = ctx.kube.conditions.rolled_out, timeout = timeout }) end
end

local function warn_orphaned_backup_schedules(ctx)
  local found = {}
  for _, name in ipairs { "etcdbackupschedules.etcd.aenix.io", "etcdbackups.etcd.aenix.io" } do
    local res = ctx.kube:lookup(name)
    if res then for o in res:list{} do found[#found + 1] = obj.key(o) end end
  end
  if #found > 0 then
    ctx.log:warn("legacy etcd.aenix.io backup resources will NOT be migrated: scheduled etcd backups stop after "
      .. "this upgrade; reconfigure them as a backups.cozystack.io BackupClass + Plan (examples/backups/etcd): "
      .. table.concat(found, ", "))
  end
end

-- The v1alpha2 CRDs the image ships (JSON files in ETCD_CRD_DIR), applied when absent.
local function ensure_v1alpha2_crds(ctx)
  local crds = ctx.kube:resource("apiextensions.k8s.io/v1", "customresourcedefinitions",
    { namespaced = false, kind = "CustomResourceDefinition" })
  if crds:find(V2_CRD) then return ctx.log:info("v1alpha2 CRDs already present") end
  if ctx.files.exists("crds") ~= "directory" then
    error("v1alpha2 CRDs are absent and the baked copy " .. ctx.params.ETCD_CRD_DIR .. " is missing from the image")
  end
  for _, file in ipairs(ctx.files.list("crds", ".json")) do
    local crd = ctx.files.json("crds", file)
    crds:apply(crd, { field_manager = "kubectl", force = true })
    ctx.log:change("CRD %s: {applied|would apply} from %s", crd.metadata.name, file)
  end
  crds:wait(V2_CRD, { condition = ctx.kube.conditions.established, timeout = 60 })
end

local function secret_value(secret, key)
  local v = obj.get(secret, { "data", key })
  return v and (base64.decode(v):gsub("%s", "")) or ""
end

-- Is bucket claimed by a live BucketClaim (COSI-provisioned)? A bucket claimed only by
-- a terminating claim cannot be classified: refused, as the shell refuses it.
local function cosi_bucket_claimed(ctx, bucket)
  local claims = ctx.kube:lookup("bucketclaims.objectstorage.k8s.io")
  if claims == nil then return false end
  local terminating = false
  for c in claims:list{} do
    if obj.get(c, "status.bucketName") == bucket then
      if not c.metadata.deletionTimestamp then return true end
      terminating = true
    end
  end
  if terminating then
    error(("bucket '%s' is claimed ONLY by a TERMINATING BucketClaim: cannot tell a COSI bucket mid-teardown from an "
      .. "external store that reuses the name; resolve the claim, then re-run"):format(bucket))
  end
  return false
end

local HATCH = "kubectl edit package.cozystack.io cozystack.cozystack-platform and set spec.components.platform.values"
  .. ".migrations.etcdAdoptSkipBackup: true (adopts every legacy etcd WITHOUT a snapshot; set it back to false after)"

-- etcd-migrate's --backup-s3-* flags for the platform-managed snapshot: the projected
-- credentials Secret's coordinates when a BucketClaim claims its bucket (endpoint forced
-- to https), else the Strategy CR's; the CR fills what the Secret lacks.
local function backup_args(ctx)
  local creds = ctx.kube:resource("v1", "secrets"):find(CREDS_NS, CREDS)
  local c = {}
  if creds and secret_value(creds, "AWS_ACCESS_KEY_ID") ~= "" and secret_value(creds, "AWS_SECRET_ACCESS_KEY") ~= "" then
    c = { ep = secret_value(creds, "endpoint"), bucket = secret_value(creds, "bucketName"),
      region = secret_value(creds, "region"), fps = secret_value(creds, "forcePathStyle") }
    if c.bucket ~= "" and cosi_bucket_claimed(ctx, c.bucket) then
      ctx.log:info(("bucket '%s' is claimed by a BucketClaim: COSI-provisioned, forcing https"):format(c.bucket))
      if c.ep ~= "" then c.ep = "https://" .. c.ep:gsub("^https?://", "") end
    else
      ctx.log:info(("no BucketClaim claims bucket '%s': treating as external S3, taking every coordinate from the "
        .. "'%s' Strategy CR"):format(c.bucket, STRATEGY))
      c = { ep = "", bucket = "", region = "", fps = "" }
    end
    local strategy = ctx.kube:lookup("etcds.strategy.backups.cozystack.io")
    local cr = strategy and strategy:find(STRATEGY)
    local s3 = cr and obj.get(cr, "spec.template.destination.s3") or {}
    for key, field in pairs { ep = "endpoint", bucket = "bucket", region = "region", fps = "forcePathStyle" } do
      if c[key] == "" and s3[field] ~= nil then c[key] = tostring(s3[field]) end
    end
  end
  if (c.ep or "") == "" or (c.bucket or "") == "" then
    error(("refusing to adopt live etcd without a safety snapshot: could not resolve the platform backup target "
      .. "(the '%s' strategy and a projected '%s' Secret with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in '%s'). "
      .. "If this cluster intentionally has no backup storage: %s"):format(STRATEGY, CREDS, CREDS_NS, HATCH))
  end
  local args = { "--backup-s3-endpoint=" .. c.ep, "--backup-s3-bucket=" .. c.bucket,
    "--backup-s3-credentials-secret=" .. CREDS, "--backup-s3-key=" .. SNAPSHOT_KEY_PREFIX }
  if c.region ~= "" then args[#args + 1] = "--backup-s3-region=" .. c.region end
  if c.fps == "true" then args[#args + 1] = "--backup-s3-force-path-style" end
  return args
end

local function split(text)
  local out = {}
  for n in text:gmatch("[^,]+") do out[#out + 1] = n end
  return out
end

local function has(list, name)
  for _, v in ipairs(list) do if v == name then return true end end
  return false
end

local function reissue_seconds(ctx)
  local n = math.tointeger(tonumber(ctx.params.ETCD_CERT_REISSUE_SECONDS))
  if n == nil or n < 1 then error("ETCD_CERT_REISSUE_SECONDS must be a whole number of seconds, not " .. ctx.params.ETCD_CERT_REISSUE_SECONDS) end
  return n
end

-- The server and peer Certificates of cluster ns/name get the native and the legacy
-- wildcard SANs, and the step waits for cert-manager to re-issue their Secrets.
local function ensure_wildcard_sans(ctx, ns, name, timeout)
  local native, certs = ("*.%s.%s.svc"):format(name, ns), assert(ctx.kube:lookup("certificates.cert-manager.io"))
  local secrets = ctx.kube:resource("v1", "secrets", { kind = "Secret" })
  for _, cert_name in ipairs { name .. "-server", name .. "-peer" } do
    local cert, secret = certs:find(ns, cert_name), secrets:find(ns, cert_name .. "-tls")
    local issued = obj.get(secret or {}, { "metadata", "annotations", "cert-manager.io/alt-names" }) or ""
    local names = obj.list(cert or {}, "spec.dnsNames")
    if cert == nil then
      ctx.log:info(("%s/%s: Certificate not found; skipping"):format(ns, cert_name))
    elseif has(names, native) or has(split(issued), native) then
      ctx.log:info(("%s/%s: native wildcard already present; nothing to do"):format(ns, cert_name))
    else
      local merged, seen = {}, {}
      for _, n in ipairs(names) do merged[#merged + 1] = n end
      merged[#merged + 1], merged[#merged + 2] = native, ("*.%s-headless.%s.svc"):format(name, ns)
      table.sort(merged)
      local unique = {}
      for _, n in ipairs(merged) do if not seen[n] then seen[n], unique[#unique + 1] = true, n end end
      certs:merge_patch(ns, cert_name, { spec = { dnsNames = unique } })
      ctx.log:change("%s/%s: {adding|would add} SANs %s (+legacy headless wildcard)", ns, cert_name, native)
      secrets:wait(ns, cert_name .. "-tls", { condition = ctx.kube.conditions.alt_names { native }, timeout = timeout })
    end
  end
end

-- A copy of the platform's snapshot credentials in ns, for etcd-migrate's snapshot Job
-- there: projector-owned (managed-by), never promoted to a tenant's (no tenantresource).
local function stage_backup_creds(ctx, source, ns)
  local copy = obj.clean(source)
  copy.metadata = { name = CREDS, namespace = ns, labels = copy.metadata.labels or {} }
  copy.metadata.labels[MANAGED_BY], copy.metadata.labels[TENANT_LABEL] = "cozystack-backups", nil
  ctx.kube:resource("v1", "secrets", { kind = "Secret" }):apply(copy, { field_manager = "kubectl", force = true })
  ctx.log:change("%s: {staged|would stage} %s", ns, CREDS)
end

local function etcd_migrate_args(...)
  local args = { "--new-controller=" .. OPERATOR_NS .. "/" .. OPERATOR, "--skip-controller-check" }
  for _, a in ipairs { ... } do args[#args + 1] = a end
  return args
end

return {
  description = "adopt the legacy etcd.aenix.io clusters onto etcd-operator.cozystack.io/v1alpha2 (etcd-migrate)",
  parameters = {
    { name = "ETCD_ADOPT_SKIP_BACKUP", default = "0", allowed = { "0", "1", "false", "true", "no", "yes" },
      description = "adopt live etcd WITHOUT the pre-adoption snapshot (the chart's migrations.etcdAdoptSkipBackup)" },
    { name = "ETCD_CERT_REISSUE_SECONDS", default = "120",
      description = "how long to wait for cert-manager to re-issue a Certificate with the wildcard SANs" },
    { name = "ETCD_CRD_DIR", default = "/etcd-operator-crds", description = "the v1alpha2 CRDs the image ships (JSON)" },
    { name = "ETCD_OPERATOR_IMAGE", default = "ghcr.io/cozystack/etcd-operator:v0.5.2",
      description = "the v1alpha2 operator image, etcd-migrate's --agent-image" },
  },
  files = { crds = "$ETCD_CRD_DIR" },
  tools = { "etcd-migrate" },
  permissions = permissions(
    allow("apiextensions.k8s.io", "customresourcedefinitions", { "get", "list", "watch", "patch" }),
    allow("etcd.aenix.io", "etcdclusters", { "list", "get", "delete" }),
    allow("etcd.aenix.io", "etcdbackupschedules", { "list" }), allow("etcd.aenix.io", "etcdbackups", { "list" }),
    allow("etcd-operator.cozystack.io", "etcdclusters", { "list", "get", "create", "patch" }),
    allow("cert-manager.io", "certificates", { "get", "patch" }),
    allow("", "secrets", { "get", "list", "watch", "patch" }),
    allow("", "configmaps", { "get", "create", "patch" }), -- etcd-migrate's snapshot (the double's stand-in)
    allow("objectstorage.k8s.io", "bucketclaims", { "list" }),
    allow("strategy.backups.cozystack.io", "etcds", { "get" }),
    allow("apps", "deployments", { "get", "list", "watch", "patch" }, OPERATOR_NS)),

  walk = function(ctx)
    local legacy = ctx.kube:lookup("etcdclusters.etcd.aenix.io")
    if legacy == nil then return ctx.log:info("No etcd.aenix.io CRD present; nothing to migrate") end
    local clusters = legacy:list{}:collect()
    ctx.log:info(("Found %d legacy etcd.aenix.io/EtcdCluster(s)"):format(#clusters))
    warn_orphaned_backup_schedules(ctx)
    if #clusters == 0 then return end
    local timeout = reissue_seconds(ctx)
    ensure_v1alpha2_crds(ctx)
    local skip_backup, args = TRUE[ctx.params.ETCD_ADOPT_SKIP_BACKUP], { "--skip-backup" }
    if skip_backup then
      ctx.log:warn("migrations.etcdAdoptSkipBackup is set: adopting live etcd WITHOUT a pre-adoption safety snapshot, "
        .. "by explicit operator request; reset the flag to false once this upgrade is through")
    else
      args = backup_args(ctx)
      ctx.log:info("safety snapshot: " .. table.concat(args, " "))
    end
    for _, c in ipairs(clusters) do ensure_wildcard_sans(ctx, c.metadata.namespace, c.metadata.name, timeout) end
    ctx.tool("etcd-migrate", etcd_migrate_args(), { dry_run = true, allow_failure = true })
    if ctx.mode == "check" then
      return ctx.finding("info", ("would adopt %d cluster(s) with etcd-migrate --apply"):format(#clusters))
    end
    if not skip_backup then
      local source = ctx.kube:resource("v1", "secrets"):get(CREDS_NS, CREDS)
      for _, c in ipairs(clusters) do stage_backup_creds(ctx, source, c.metadata.namespace) end
    end
    operator_down = true
    scale_operator(ctx, 0, 120)
    ctx.tool("etcd-migrate", etcd_migrate_args("--apply", "--yes", "--agent-image=" .. ctx.params.ETCD_OPERATOR_IMAGE,
      table.unpack(args)))
    operator_down = false
    scale_operator(ctx, 1, nil)
    ctx.outcome { adopted = #clusters }
    local ok, err = pcall(function()
      deployments(ctx):wait(OPERATOR_NS, OPERATOR, { condition = ctx.kube.conditions.rolled_out, timeout = 180 })
    end)
    if not ok then ctx.log:warn("the operator has not rolled out again: " .. tostring(err)) end
  end,

  -- the shell's EXIT trap: the operator back at 1 however the step ended after its
  -- scale-down (a success scaled it up already); not waited on: finally has 30 s
  finally = function(ctx)
    if not operator_down then return end
    operator_down = false
    scale_operator(ctx, 1, nil)
  end,
}
