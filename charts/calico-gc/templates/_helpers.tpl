{{/* The release's name for its objects: the release name when it already says calico-gc, else
<release>-calico-gc. With the default release name it is calico-gc, as in manifests/. */}}
{{- define "calico-gc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The names RBAC grants by name follow the release, so that two releases never share them. */}}
{{- define "calico-gc.stateConfigMap" -}}{{ include "calico-gc.fullname" . }}-state{{- end -}}
{{- define "calico-gc.lease" -}}{{ include "calico-gc.fullname" . }}{{- end -}}
{{- define "calico-gc.reports" -}}{{ include "calico-gc.fullname" . }}-report{{- end -}}

{{- define "calico-gc.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
