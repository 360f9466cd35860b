-- The runtime image without a container engine: deploy/Dockerfile's
-- RUNTIME_PACKAGES must be exactly the packages owning the libraries the
-- binary links (ldd); a root assembled from those packages' files (apt-get
-- download + dpkg -x, as the Dockerfile's rootfs stage does) must run
-- `cozy-migrate run` in-cluster against the fake, as a non-root uid, with
-- nothing in it writable. Needs the Debian mirror for the download (cached
-- under build/runtime-debs/): unreachable, the spec fails.
local fake = require("spec.helpers").server
local cli = require("spec.helpers").cli

local q = cli.quote
local CACHE = "build/runtime-debs"
local UID = 65532
local CLUSTER = "spec/fixtures/59-vmi-hotplug/cluster.json"
-- A sanitizer build (hack/test.sh runs every spec against one too) links
-- the sanitizers' runtime besides; the image never ships such a binary.
local SANITIZER_RUNTIME = { "libasan8", "libgcc-s1", "libstdc++6", "libubsan1" }

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok, out, code
end

local function dockerfile_packages()
  local text = assert(cli.slurp("deploy/Dockerfile"))
  local list = assert(text:match('ARG RUNTIME_PACKAGES="(.-)"'), "no RUNTIME_PACKAGES in deploy/Dockerfile")
  local set = {}
  for name in list:gsub("\\\n", " "):gmatch("[%w%.%+%-]+") do set[name] = true end
  return set
end

-- Packages owning the binary's shared libraries, as dpkg knows them.
local function ldd_packages(bin)
  local ok, out = sh("ldd " .. q(bin))
  assert(ok, out)
  local set, libs = {}, {}
  for line in out:gmatch("[^\n]+") do
    local path = line:match("=>%s+(/%S+)") or line:match("^%s*(/%S+)")
    if path then libs[#libs + 1] = path end
  end
  assert(#libs > 3, out)
  for _, path in ipairs(libs) do
    local _, real = sh("realpath " .. q(path))
    real = real:gsub("%s+$", "")
    local owner
    for _, candidate in ipairs({ real, path, (real:gsub("^/usr", "")), "/usr" .. path }) do
      local found, answer = sh("dpkg -S " .. q(candidate))
      if found then owner = answer:match("^([^:]+)") break end
    end
    assert(owner, "no package owns " .. path)
    set[owner] = true
  end
  return set
end

local function sanitized(bin)
  local _, out = sh("ldd " .. q(bin))
  return out:find("libasan", 1, true) ~= nil
end

-- The packages a root needs for this binary: the Dockerfile's, plus the
-- sanitizer runtime for a sanitizer build.
local function expected_packages(bin)
  local set = dockerfile_packages()
  if sanitized(bin) then
    for _, name in ipairs(SANITIZER_RUNTIME) do set[name] = true end
  end
  return set
end

local function keys(set)
  local out = {}
  for k in pairs(set) do out[#out + 1] = k end
  table.sort(out)
  return out
end

describe("the runtime image's closure", function()
  -- no container engine here: this reads deploy/Dockerfile's text; that the
  -- root its stages assemble really runs is the third case below
  it("deploy/Dockerfile declares the default image as scratch plus the rootfs, uid 65532, `cozy-migrate run`; LEGACY=1 the shell tools", function()
    local text = assert(cli.slurp("deploy/Dockerfile"))
    local default = assert(text:match("FROM scratch AS runtime%-0\n(.-)\n\n"))
    assert.same({ "COPY --from=rootfs /rootfs/ /" }, (function()
      local lines = {}
      for l in default:gmatch("[^\n]+") do lines[#lines + 1] = l end
      return lines
    end)())
    local final = assert(text:match("FROM runtime%-%${LEGACY}\n(.*)$"))
    assert.matches("COPY %-%-from=build /src/build/cozy%-migrate /usr/bin/cozy%-migrate", final)
    assert.matches("USER 65532:65532", final)
    assert.matches('ENTRYPOINT %["cozy%-migrate"%]', final)
    assert.matches('CMD %["run"%]', final)
    local legacy = assert(text:match("FROM debian:bookworm%-slim AS runtime%-1\n(.-)\n\n"))
    for _, want in ipairs({ "%${RUNTIME_PACKAGES}", "bash", "coreutils", "jq",
        "COPY %-%-from=tools /out/kubectl /out/helm /usr/local/bin/",
        "COPY %-%-from=platform /out/cozyhr /out/etcd%-migrate /usr/local/bin/",
        "COPY %-%-from=platform /out/etcd%-operator%-crds /etcd%-operator%-crds",
        "COPY %-%-from=legacy / /migrations/", "rm %-f \"/migrations/%$n\"", "builtin%-numbers" }) do
      assert.matches(want, legacy)
    end
    -- Debian's kubectl (1.20) lacks --subresource: the fetched one replaces it
    assert.is_nil(legacy:find("kubernetes-client", 1, true))
    -- the platform's own tools come from its migrations image, named by a build
    -- argument that has no usable default (a build without it fails at FROM)
    assert.matches("\nARG PLATFORM_MIGRATIONS_IMAGE=unset%-PLATFORM_MIGRATIONS_IMAGE\n", text)
    local platform = assert(text:match("FROM %${PLATFORM_MIGRATIONS_IMAGE} AS platform\n(.-)\n\n"))
    for _, want in ipairs({ "for tool in cozyhr etcd%-migrate", 'command %-v "%$tool"', "cp %-R /etcd%-operator%-crds " }) do
      assert.matches(want, platform)
    end
  end)

  -- Text only: no network and no container engine here, so nothing is
  -- downloaded or built; what this proves is that the transition image asks
  -- for the kubectl and helm the specs build and run (spec/support/tools),
  -- and that each download, on each arch, goes through sha256sum -c against
  -- a pinned sum. That the sums are the releases' own is checked by the
  -- image build itself, which fails on a mismatch.
  it("deploy/Dockerfile's transition image fetches the specs' kubectl and helm, each checked against a pinned SHA-256", function()
    local text = assert(cli.slurp("deploy/Dockerfile"))
    local tools = assert(text:match("FROM debian:bookworm%-slim AS tools\n(.-)\n\n"))
    local gomod = assert(cli.slurp("spec/support/tools/go.mod"))
    local helm = assert(gomod:match("\n%s*helm%.sh/helm/v3 (v[%d%.]+)\n"))
    local minor, patch = assert(gomod:match("\n%s*k8s%.io/kubectl v0%.(%d+)%.(%d+)\n"))
    assert.equal("v1." .. minor .. "." .. patch, tools:match("ARG KUBECTL_VERSION=(%S+)"))
    assert.equal(helm, tools:match("ARG HELM_VERSION=(%S+)"))
    assert.matches('"https://dl%.k8s%.io/release/%${KUBECTL_VERSION}/bin/linux/%${TARGETARCH}/kubectl"', tools)
    assert.matches('"https://get%.helm%.sh/helm%-%${HELM_VERSION}%-linux%-%${TARGETARCH}%.tar%.gz"', tools)
    for _, arch in ipairs({ "amd64", "arm64" }) do
      local case = assert(tools:match("\n%s*" .. arch .. "%)(.-);;"), arch)
      assert.matches('kubectl_sha256="%x+"', case)
      assert.equal(64, #case:match('kubectl_sha256="(%x+)"'))
      assert.equal(64, #case:match('helm_sha256="(%x+)"'))
    end
    assert.matches('echo "%${kubectl_sha256}  /out/kubectl" | sha256sum %-c %-', tools)
    assert.matches('echo "%${helm_sha256}  /tmp/helm%.tar%.gz" | sha256sum %-c %-', tools)
    -- an arch without pinned sums fails the build rather than fetch unchecked
    assert.matches("%*%) echo \"unsupported TARGETARCH", tools)
  end)

  it("installs exactly the packages of the libraries the binary links", function()
    assert.same(keys(ldd_packages(cli.bin)), keys(expected_packages(cli.bin)))
  end)

  it("runs cozy-migrate from a root of those packages, in-cluster, as a non-root uid", function()
    local packages = keys(expected_packages(cli.bin))
    assert(os.execute("mkdir -p " .. q(CACHE)))
    local missing = {}
    for _, name in ipairs(packages) do
      local ok = sh(("ls %s/%s_*.deb"):format(q(CACHE), name))
      if not ok then missing[#missing + 1] = name end
    end
    if #missing > 0 then
      local ok, out = sh(("cd %s && apt-get download %s"):format(q(CACHE), table.concat(missing, " ")))
      assert(ok, "apt-get download failed (the Debian mirror is needed): " .. out)
    end

    local root = cli.tmpdir()
    local proc_mounted, srv = false, nil
    -- busted keeps one finally per test: every cleanup is here
    finally(function()
      if srv then srv:stop() end
      if proc_mounted then os.execute("umount " .. q(root .. "/proc")) end
      os.execute("rm -rf --one-file-system " .. q(root))
    end)
    for _, name in ipairs(packages) do
      local ok, out = sh(("for d in %s/%s_*.deb; do dpkg -x \"$d\" %s || exit 1; done"):format(q(CACHE), name, q(root)))
      assert(ok, out)
    end
    local sa = root .. "/var/run/secrets/kubernetes.io/serviceaccount"
    srv = fake.start{ fixtures = { CLUSTER }, tls = true, token = "image-token" }
    local setup_cmds = {
      ("mkdir -p %s/usr/bin %s/etc %s"):format(q(root), q(root), q(sa)),
      ("install -m 0755 %s %s/usr/bin/cozy-migrate"):format(q(cli.bin), q(root)),
      ("printf 'cozy-migrate:x:%d:%d::/nonexistent:/usr/sbin/nologin\\n' >%s/etc/passwd"):format(UID, UID, q(root)),
      ("printf 'image-token\\n' >%s/token && cp %s %s/ca.crt && printf cozy-system >%s/namespace"):format(
        q(sa), q(srv.ca), q(sa), q(sa)),
      ("printf secret >%s/etc/root-only && chmod 0600 %s/etc/root-only"):format(q(root), q(root)),
      -- as the kubelet projects them: world-readable (defaultMode 0644)
      ("chmod 0644 %s/token %s/ca.crt %s/namespace"):format(q(sa), q(sa), q(sa)),
      ("chown -R 0:0 %s && chmod 0755 %s"):format(q(root), q(root)),
    }
    for _, c in ipairs(setup_cmds) do
      local ok, out = sh(c)
      assert(ok, c .. ": " .. out)
    end
    -- read-only friendly: nothing in the root is writable by the runtime uid
    local _, writable = sh(("find %s ! -type l \\( -perm -o+w -o -user %d \\)"):format(q(root), UID))
    assert.equal("", writable)

    local port = srv.url:match(":(%d+)$")
    local found, chroot = sh("command -v chroot")
    assert(found, "no chroot (coreutils)")
    chroot = chroot:gsub("%s+$", "")
    -- the sanitizers' runtime reads /proc (LeakSanitizer at exit); a
    -- container has it mounted, the plain binary does not need it
    if sanitized(cli.bin) then
      local mok, mout = sh(("mkdir -p %s/proc && mount -t proc proc %s/proc"):format(q(root), q(root)))
      assert(mok, "mount /proc for the sanitizer build: " .. mout)
      proc_mounted = true
    end
    local asan = os.getenv("ASAN_OPTIONS") and ("ASAN_OPTIONS=" .. q(os.getenv("ASAN_OPTIONS")) .. " ") or ""
    local function in_root(args)
      return sh(("env -i %sKUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=%s POD_NAME=hook-pod "
        .. "%s --userspec=%d:%d %s /usr/bin/cozy-migrate %s"):format(asan, port, chroot, UID, UID, q(root), args))
    end
    -- the uid is not root: a root-only file cannot be read
    local ok, out, code = in_root([[lua -e 'local f = io.open("/etc/root-only") os.exit(f and 0 or 3)']])
    assert.falsy(ok, out)
    assert.equal(3, code, out)

    ok, out = in_root("run")
    assert.is_true(ok, out)
    local cm = srv:object("ConfigMap", "cozy-system", "cozystack-version")
    assert.equal("60", cm.data.version)
    assert.matches("updated 7 VMs", out)
    local h = cli.history(cm)
    assert.same({ 59, "hook-pod" }, { h[#h].number, h[#h].runner })
  end)
end)
