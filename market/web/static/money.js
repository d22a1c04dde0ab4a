// money.js: amounts in minor units (what the edge answers) as the
// reader's locale writes them, in the currency's own fraction digits.

export function fractionDigits (currency) {
  try {
    return new Intl.NumberFormat('en', { style: 'currency', currency }).resolvedOptions().maximumFractionDigits
  } catch (e) {
    return 2
  }
}

export function money (minor, currency) {
  const cur = (currency || 'eur').toUpperCase()
  const d = fractionDigits(cur)
  const v = minor / 10 ** d
  try {
    return new Intl.NumberFormat(undefined, { style: 'currency', currency: cur }).format(v)
  } catch (e) {
    return `${v.toFixed(d)} ${cur}`
  }
}
