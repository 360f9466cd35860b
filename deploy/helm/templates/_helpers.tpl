{{/*
"true" when the hook runs: migrations are enabled and the version
ConfigMap exists below the target. A fresh install (no ConfigMap) runs no
migration: migration-hook.yaml creates the ConfigMap at the target instead.
*/}}
{{- define "cozy-migrate.pending" -}}
{{- $cm := lookup "v1" "ConfigMap" .Release.Namespace "cozystack-version" -}}
{{- if and .Values.migrations.enabled $cm (lt (int $cm.data.version) (int .Values.migrations.targetVersion)) -}}
true
{{- end -}}
{{- end -}}
