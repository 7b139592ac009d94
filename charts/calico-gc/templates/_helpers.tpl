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

{{/* A duration value, as given, once it is no longer than 365d: the most the job takes of any
setting (MAX_DURATION), which a schema pattern cannot say of a sum of parts such as 300d100d.
The parts are summed in seconds; a part of more than 11 digits before its point is past 365d in
any unit (Sprig's float64 of a number past float64 would be 0). Call with (list NAME VALUE). */}}
{{- define "calico-gc.duration" -}}
{{- $name := index . 0 -}}
{{- $value := toString (index . 1) -}}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 -}}
{{- $seconds := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)" $value -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- if gt (len (regexReplaceAll "^0+" (regexReplaceAll "\\..*" $number "") "")) 11 -}}
{{- $seconds = 1e12 -}}
{{- else -}}
{{- $seconds = addf $seconds (mulf (float64 $number) (get $units (trimPrefix $number .))) -}}
{{- end -}}
{{- end -}}
{{- if gt $seconds 31536000.0 -}}
{{- fail (printf "%s: %q is longer than 365d, the most calico-gc takes of any duration" $name $value) -}}
{{- end -}}
{{- $value -}}
{{- end -}}
